// Argument handling, help, layouts with their sizes, the JSON envelope and
// progress: what every subcommand shares (cli.hpp).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "cli.hpp"
#include "nvfp4kv/core/names.hpp"

namespace nvfp4kv::cli {

std::vector<OptionSpec> size_options() {
  return {{"layers", "L", "layers (the layout's own, else 1)"},
          {"pages", "P", "pages per layer"},
          {"heads", "H", "kv heads the layout holds (per tensor-parallel rank)"},
          {"head-dim", "D", "head dim, a multiple of 16"},
          {"tokens-per-page", "N", "tokens per page"},
          {"k-element", "nvfp4|fp8_e4m3", "what K's bytes hold (the layout's own, else nvfp4)"},
          {"v-element", "nvfp4|fp8_e4m3", "what V's bytes hold (the layout's own, else nvfp4)"}};
}

std::optional<ElementFormat> element_option(const Args& a, const std::string& name) {
  const std::optional<std::string> v = a.get(name);
  if (!v) return std::nullopt;
  if (std::optional<ElementFormat> f = element_format_named(*v)) return f;
  throw UsageError("--" + name + " expects nvfp4 or fp8_e4m3, got " + quote_text(*v));
}

std::string help_text(const CommandSpec& spec) {
  std::ostringstream s;
  s << "usage: nvfp4kv " << spec.name << (spec.arguments.empty() ? "" : " " + spec.arguments)
    << (spec.options.empty() ? "" : " [options]") << "\n\n"
    << spec.summary << "\n";
  if (!spec.options.empty()) s << "\noptions:\n";
  size_t width = 0;
  for (const OptionSpec& o : spec.options)
    width = std::max(width, std::string(o.name).size() + (o.value ? std::string(o.value).size() + 1 : 0));
  for (const OptionSpec& o : spec.options) {
    std::string left = std::string("--") + o.name + (o.value ? std::string(" ") + o.value : "");
    // A help text of several lines continues under its first.
    std::string help = o.help;
    for (size_t at = help.find('\n'); at != std::string::npos; at = help.find('\n', at + 1))
      help.insert(at + 1, std::string(width + 8, ' '));
    s << "  " << left << std::string(width + 4 - left.size() + 2, ' ') << help << (o.repeat ? " (repeatable)" : "") << "\n";
  }
  s << "  --help" << std::string(width > 2 ? width - 2 : 1, ' ') << "  this help\n";
  if (!spec.notes.empty()) s << "\n" << spec.notes << (spec.notes.back() == '\n' ? "" : "\n");
  s << "\nexit codes: 0 success, 1 a negative verdict (rejected, disagree, failed), 2 unusable input,\n"
       "3 not possible here (no GPU, built without CUDA). Reports go to stdout, usage errors to stderr.\n";
  return s.str();
}

Args::Args(const std::vector<std::string>& argv, const CommandSpec& spec) {
  const auto find = [&](const std::string& n) -> const OptionSpec* {
    for (const OptionSpec& o : spec.options)
      if (n == o.name) return &o;
    return nullptr;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const OptionSpec* o = find(name);
    if (!o) {
      std::vector<std::string> names;
      for (const OptionSpec& x : spec.options) names.push_back(x.name);
      names.push_back("help");
      const std::string near = closest_name(name, names);
      throw UsageError("unknown option " + quote_text("--" + name) + (near.empty() ? "" : " (did you mean \"--" + near + "\"?)") +
                       "; nvfp4kv " + spec.name + " --help lists its options");
    }
    if (!o->value) {
      if (inline_value) throw UsageError("--" + name + " takes no value");
      if (flags_.count(name)) throw UsageError("--" + name + " is given twice");
      flags_[name] = true;
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argv.size()) throw UsageError("--" + name + " needs a value (" + o->value + ")");
      value = argv[++i];
    }
    if (!o->repeat && values_.count(name)) throw UsageError("--" + name + " is given twice");
    values_[name].push_back(value);
  }
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> Args::get_all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int run_group(const std::string& group, const std::vector<Subcommand>& subs, const std::vector<std::string>& argv,
              const std::string& footer) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {  // asked for: stdout; missing: usage on stderr
    std::ostream& out = argv.empty() ? std::cerr : std::cout;
    out << "usage: nvfp4kv " << group << " SUBCOMMAND ...\n\n";
    for (const Subcommand& s : subs) out << "  " << s.synopsis << "\n";
    out << "\nnvfp4kv " << group << " SUBCOMMAND --help lists its options" << footer << "\n";
    return argv.empty() ? kExitUsage : kExitOk;
  }
  std::vector<std::string> names;
  for (const Subcommand& s : subs) {
    names.push_back(s.name);
    if (argv[0] != s.name) continue;
    const Args a(std::vector<std::string>(argv.begin() + 1, argv.end()), s.spec());
    if (a.help()) {
      std::cout << help_text(s.spec());
      return kExitOk;
    }
    return s.run(a);
  }
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  throw UsageError("unknown " + group + " subcommand " + quote_text(argv[0]) + did_you_mean(argv[0], names) + " (" +
                   list + ")");
}

namespace {

// Parses the whole of `text` with `parse` (std::stoll / std::stod style); returns
// how many characters it used, 0 on failure.
template <typename T, typename Parse>
size_t parse_prefix(const std::string& text, Parse parse, T& out) {
  size_t used = 0;
  try {
    out = parse(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  return used;
}

}  // namespace

std::optional<int64_t> Args::integer(const std::string& name) const {
  const auto v = get(name);
  if (!v) return std::nullopt;
  int64_t x = 0;
  const size_t used = parse_prefix(*v, [](const std::string& s, size_t* n) { return std::stoll(s, n); }, x);
  if (used == 0 || used != v->size()) throw UsageError("--" + name + " expects an integer in [-2^63, 2^63), got " + quote_text(*v));
  return x;
}

std::optional<int64_t> Args::bytes(const std::string& name) const {
  const auto v = get(name);
  if (!v) return std::nullopt;
  double x = 0;
  const size_t used = parse_prefix(*v, [](const std::string& s, size_t* n) { return std::stod(s, n); }, x);
  const std::string unit = v->substr(used);
  double mult = 0;
  for (auto [u, m] : {std::pair{"", 1.0}, {"B", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                      {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}})
    if (unit == u) mult = m;
  if (used == 0 || mult == 0 || !(x * mult >= 0) || x * mult > 9e18)
    throw UsageError("--" + name + " expects a size such as 4096, 512MiB or 80GiB, got " + quote_text(*v));
  return int64_t(x * mult);
}

DimsOverride dims_from(const Args& a) {
  return {a.integer("layers"),   a.integer("pages"),           a.integer("tokens-per-page"),
          a.integer("heads"),    a.integer("head-dim"),        element_option(a, "k-element"),
          element_option(a, "v-element")};
}

LoadedLayout load_layout(const std::string& name_or_path, const DimsOverride& given, const DimsOverride& fallback) {
  LoadedLayout out;
  out.spec = load_spec(name_or_path);
  DimsOverride dims = given;
  const auto fill = [&](std::optional<int64_t>& d, std::optional<int64_t> file, std::optional<int64_t> fb, const char* what) {
    if (!d && !file && fb) {
      d = fb;
      out.assumed.push_back(std::string(what) + " " + std::to_string(*fb));
    }
  };
  fill(dims.pages, out.spec.defaults.pages, fallback.pages, "pages");
  fill(dims.tokens_per_page, out.spec.defaults.tokens_per_page, fallback.tokens_per_page, "tokens per page");
  fill(dims.heads, out.spec.defaults.heads, fallback.heads, "heads");
  fill(dims.head_dim, out.spec.defaults.head_dim, fallback.head_dim, "head dim");
  for (const std::string& a : assumed_sizes(out.spec, dims)) out.assumed.insert(out.assumed.begin(), a);
  out.layout = instantiate(out.spec, dims);
  return out;
}

std::string assumed_line(const std::vector<std::string>& assumed) {
  if (assumed.empty()) return "";
  static const std::pair<const char*, const char*> kFlags[] = {
      {"layers", "--layers"}, {"pages", "--pages"}, {"tokens per page", "--tokens-per-page"}, {"heads", "--heads"},
      {"head dim", "--head-dim"}};
  std::string sizes, flags;
  for (size_t i = 0; i < assumed.size(); ++i) {
    sizes += (i ? ", " : "") + assumed[i];
    for (const auto& [what, flag] : kFlags)
      if (assumed[i].rfind(std::string(what) + " ", 0) == 0 && (std::string(what) != "heads" || assumed[i].rfind("head dim", 0) != 0))
        flags += std::string(flags.empty() ? "" : ", ") + flag;
  }
  const bool one = assumed.size() == 1;
  return "assumed: " + sizes + " (neither the layout nor the command line sets " + (one ? "it" : "them") + "; " + flags +
         (one ? " does)" : " do)");
}

std::string json_envelope(const std::string& command, const std::string& fields) {
  nlohmann::ordered_json j;
  j["schema"] = "nvfp4kv-cli";
  j["version"] = kJsonVersion;
  j["command"] = command;
  const nlohmann::ordered_json f = nlohmann::ordered_json::parse(fields);
  for (auto it = f.begin(); it != f.end(); ++it) j[it.key()] = it.value();
  return j.dump(2);
}

// ---- JSON pieces -------------------------------------------------------------------
Json dims_json(const CacheDims& d) {
  return {{"layers", d.layers},
          {"pages", d.pages},
          {"tokens_per_page", d.tokens_per_page},
          {"heads", d.heads},
          {"head_dim", d.head_dim},
          {"elements", {{"k", element_format_name(d.k_element)}, {"v", element_format_name(d.v_element)}}}};
}

Json element_json(Region r, const Coord& c) {
  return {{"element", describe_element(r, c)}, {"region", region_name(r)}, {"layer", c.layer}, {"page", c.page},
          {"token", c.token}, {"head", c.head}, {"column", c.column}};
}

const char* verdict_name(const CheckReport& r) { return r.ok ? "sound" : r.undecided ? "undecided" : "rejected"; }

Json check_json(const CheckReport& r) {
  Json access = Json::object();
  for (Region reg : kAllRegions) {
    const RegionAccess& a = r.access[size_t(reg)];
    access[region_name(reg)] = a.holds ? Json{{"vector_bytes", a.vector_bytes}, {"dense_plane", a.dense_plane},
                                              {"plane_align", a.plane_align}}
                                       : Json(nullptr);  // an FP8 side's scales: nothing there
  }
  Json collision = nullptr;
  if (r.collision)
    collision = {{"a", element_json(r.collision->a, r.collision->coord_a)},
                 {"b", element_json(r.collision->b, r.collision->coord_b)},
                 {"buffer", r.collision->buffer},
                 {"byte", r.collision->byte}};
  return {{"verdict", verdict_name(r)},
          {"ok", r.ok},
          {"summary", r.summary()},
          {"problems", r.problems},
          {"collision", collision},
          {"colliding_pairs", r.colliding_pairs},
          {"elements", r.elements},
          {"elements_enumerated", r.elements_enumerated},
          {"seconds", r.seconds},
          {"access", access}};
}

Json provenance_json(const Provenance& p) {
  if (p.empty()) return nullptr;
  return {{"engine", p.engine}, {"version", p.version}, {"gpu_path", p.gpu_path}, {"role", p.role},
          {"sources", p.sources}, {"expressions", p.expressions}, {"notes", p.notes}};
}

Json layout_json(const Layout& l) { return Json::parse(to_json(l)); }

void print_json(const std::string& command, const Json& fields) {
  std::cout << json_envelope(command, fields.dump()) << "\n";
}

// ---- progress ------------------------------------------------------------------
struct StderrProgress::State {
  std::string command;
  std::mutex m;
  std::condition_variable cv;
  std::string stage = "starting";
  double fraction = 0;
  bool stop = false, printed = false;
  const bool tty = isatty(STDERR_FILENO) != 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::thread ticker;

  void print_locked() {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[256];
    std::snprintf(line, sizeof line, "nvfp4kv %s: %s, %.0f%% (%.0f s)", command.c_str(), stage.c_str(), 100 * fraction, s);
    std::cerr << (tty ? "\r\033[K" : "") << line << (tty ? "" : "\n") << std::flush;
    printed = true;
  }
};

StderrProgress::StderrProgress(std::string command) : state_(std::make_shared<State>()) {
  state_->command = std::move(command);
  std::shared_ptr<State> st = state_;
  st->ticker = std::thread([st] {
    std::unique_lock<std::mutex> lock(st->m);
    if (st->cv.wait_for(lock, std::chrono::seconds(2), [&] { return st->stop; })) return;
    while (!st->stop) {
      st->print_locked();
      st->cv.wait_for(lock, std::chrono::seconds(st->tty ? 1 : 5), [&] { return st->stop; });
    }
  });
}

StderrProgress::~StderrProgress() {
  {
    std::lock_guard<std::mutex> lock(state_->m);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->ticker.join();
  if (state_->printed && state_->tty) std::cerr << "\n";
}

Progress StderrProgress::callback() {
  std::shared_ptr<State> st = state_;
  return [st](std::string_view stage, double fraction) {
    std::lock_guard<std::mutex> lock(st->m);
    st->stage = std::string(stage);
    st->fraction = fraction;
  };
}

}  // namespace nvfp4kv::cli
