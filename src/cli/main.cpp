// nvfp4kv: the command-line front end. Each subcommand validates its arguments
// and calls the library. Exit codes: 0 success, 1 rejected layout, disagreement
// or failed check, 2 unusable input (bad usage, refused text or sizes).
#include <cstdio>
#include <iostream>

#include "cli.hpp"

namespace nvfp4kv::cli {

Args::Args(const std::vector<std::string>& argv, std::initializer_list<const char*> flags,
           std::initializer_list<const char*> options) {
  const auto known = [](std::initializer_list<const char*> list, const std::string& n) {
    for (const char* k : list)
      if (n == k) return true;
    return false;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) {
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
    if (known(flags, name)) {
      if (inline_value) throw UsageError("--" + name + " takes no value");
      flags_[name] = true;
    } else if (known(options, name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) throw UsageError("--" + name + " needs a value");
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      throw UsageError("unknown option " + quote_text("--" + name));
    }
  }
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
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
  if (used == 0 || used != v->size())
    throw UsageError("--" + name + " expects an integer in [-2^63, 2^63), got " + quote_text(*v));
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
  return {a.integer("layers"), a.integer("pages"), a.integer("tokens-per-page"), a.integer("heads"),
          a.integer("head-dim")};
}

}  // namespace nvfp4kv::cli

namespace {

void usage(std::FILE* to) {
  std::fputs(
      "nvfp4kv: NVFP4 KV-cache layouts, quantization and kernels\n"
      "\n"
      "usage:\n"
      "  nvfp4kv demo [--tokens T] [--seed S]       quantize a model-like KV tensor, check layouts, round-trip\n"
      "  nvfp4kv layout presets                    list the built-in layouts and their verdicts\n"
      "  nvfp4kv layout show LAYOUT [sizes]        regions, sizes, capacity and a byte map of one page\n"
      "  nvfp4kv layout check LAYOUT [sizes]       prove a layout sound or say where it breaks\n"
      "  nvfp4kv layout compare WRITER READER [sizes]  do two descriptions place every element alike?\n"
      "  nvfp4kv layout plan --layers L --kv-heads H --head-dim D (--memory BYTES | --pages P) [...]\n"
      "  nvfp4kv roundtrip --layout LAYOUT [sizes]  store then gather on the CPU reference and the GPU\n"
      "  nvfp4kv bench decode [--batch B,...] [--context L,...] [--q-heads H] [--kv-heads H] [--head-dim D]\n"
      "                       [--tokens-per-page N] [--layout LAYOUT] [--fp16] [--json]   time decode attention\n"
      "\n"
      "LAYOUT is a preset name or a JSON file (docs/layouts.md). sizes: --layers --pages --heads\n"
      "--head-dim --tokens-per-page, where the layout leaves them open.\n"
      "exit codes: 0 sound / agree / passed; 1 rejected layout / disagreement / failed check (the verdict on\n"
      "stderr); 2 unusable input: bad usage, layout text or sizes refused (one line on stderr)\n",
      to);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace nvfp4kv::cli;
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  try {
    if (cmd == "demo") return run_demo(rest);
    if (cmd == "layout") return run_layout(rest);
    if (cmd == "roundtrip") return run_roundtrip(rest);
    if (cmd == "bench") return run_bench(rest);
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      usage(stdout);
      return 0;
    }
    std::cerr << "nvfp4kv: unknown command " << nvfp4kv::quote_text(cmd) << "\n\n";
    usage(stderr);
    return 2;
  } catch (const UsageError& e) {
    std::cerr << "nvfp4kv " << cmd << ": " << e.what() << " (nvfp4kv help for usage)\n";
    return 2;
  } catch (const nvfp4kv::LayoutError& e) {
    std::cerr << "nvfp4kv " << cmd << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "nvfp4kv " << cmd << ": error: " << e.what() << "\n";
    return 1;
  }
}
