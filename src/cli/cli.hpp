#pragma once
// What the subcommands share: their option tables (the one source of --help and of
// "did you mean"), argument parsing, layouts with their sizes, the JSON envelope
// (docs/cli-json.md) and progress on stderr. Subcommands validate and forward.
#include <iosfwd>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/progress.hpp"
#include "nvfp4kv/harness/roundtrip.hpp"

namespace nvfp4kv::cli {

// Exit codes (docs/cli-json.md): the same for every command.
inline constexpr int kExitOk = 0;          // sound, agree, passed
inline constexpr int kExitVerdict = 1;     // rejected, disagree, failed check
inline constexpr int kExitUsage = 2;       // unusable input: usage, files, sizes
inline constexpr int kExitUnavailable = 3; // the command needs what this machine or build lacks (a GPU, CUDA)

// Bad usage: one line on stderr, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OptionSpec {
  const char* name;   // without "--"
  const char* value;  // "N", "FILE", ... or nullptr for a flag
  const char* help;
  bool repeat = false;  // may be given more than once (get_all)
};

struct CommandSpec {
  std::string name;       // "layout check"
  std::string arguments;  // "LAYOUT"
  std::string summary;    // one line
  std::vector<OptionSpec> options;
  std::string notes;      // more lines for --help
};

// The options every layout-taking command has.
std::vector<OptionSpec> size_options();
inline const OptionSpec kJsonOption{"json", nullptr, "print the result as JSON (docs/cli-json.md) instead of text"};

// The command's help: usage, every option with its value and meaning.
std::string help_text(const CommandSpec& spec);

class Args {
 public:
  // Throws UsageError for an unknown option (with "did you mean"), a value missing
  // or given to a flag, an option given twice that may not be.
  Args(const std::vector<std::string>& argv, const CommandSpec& spec);
  bool help() const { return help_; }
  const std::vector<std::string>& positional() const { return positional_; }
  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::vector<std::string> get_all(const std::string& name) const;
  std::optional<int64_t> integer(const std::string& name) const;
  std::optional<int64_t> bytes(const std::string& name) const;  // 512MiB, 80GiB, 1e9

 private:
  bool help_ = false;
  std::vector<std::string> positional_;
  std::map<std::string, std::vector<std::string>> values_;
  std::map<std::string, bool> flags_;
};

DimsOverride dims_from(const Args& args);
// --k-element / --v-element: nvfp4 or fp8_e4m3 (UsageError otherwise).
std::optional<ElementFormat> element_option(const Args& args, const std::string& name);

// A check's exit code: 0 sound, 1 unsound, 2 undecided (sizes past the proof's bounds).
inline int verdict_code(const CheckReport& r) { return r.ok ? kExitOk : r.undecided ? kExitUsage : kExitVerdict; }

// A command group (`layout`, `conformance`): its subcommands, each with a one-line
// synopsis, its option table and what runs it.
struct Subcommand {
  const char* name;
  const char* synopsis;  // "show LAYOUT [sizes]    regions, sizes, ..."
  const CommandSpec& (*spec)();
  int (*run)(const Args&);
};
// Dispatches argv[0] to its subcommand (with "did you mean"), answers --help for the
// group and for each subcommand.
int run_group(const std::string& group, const std::vector<Subcommand>& subcommands, const std::vector<std::string>& argv,
              const std::string& footer);

// A layout bound to sizes: the file's, the command line's (which may repeat but
// not contradict the file's) and, for sizes both leave open, `fallback`'s, which
// are then listed in `assumed` ("layers 1") for the command to print.
struct LoadedLayout {
  LayoutSpec spec;
  Layout layout;
  std::vector<std::string> assumed;
};
LoadedLayout load_layout(const std::string& name_or_path, const DimsOverride& given, const DimsOverride& fallback = {});
// "assumed: layers 1 (the layout leaves it open; --layers sets it)", or "" when nothing was.
std::string assumed_line(const std::vector<std::string>& assumed);

// The JSON envelope of every --json output: {"schema": "nvfp4kv-cli", "version": 1,
// "command": ..., fields...}; `fields` is a JSON object's text.
std::string json_envelope(const std::string& command, const std::string& fields);
inline constexpr int kJsonVersion = 1;
using Json = nlohmann::ordered_json;
// Pieces the commands' JSON shares (docs/cli-json.md names them).
Json dims_json(const CacheDims& d);
Json element_json(Region r, const Coord& c);
// "sound", "rejected" or "undecided" (past the proof's bounds), as JSON names a verdict.
const char* verdict_name(const CheckReport& r);
Json check_json(const CheckReport& r);
Json provenance_json(const Provenance& p);
Json layout_json(const Layout& l);  // the text form: a file `layout check` loads
void print_json(const std::string& command, const Json& fields);  // the envelope and fields, on stdout

// Progress on stderr for work that may take long: nothing for the first two
// seconds, then the current stage about once a second, on one line when stderr
// is a terminal. The returned guard stops the ticker when it goes away.
class StderrProgress {
 public:
  explicit StderrProgress(std::string command);
  ~StderrProgress();
  StderrProgress(const StderrProgress&) = delete;
  StderrProgress& operator=(const StderrProgress&) = delete;
  Progress callback();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

int run_demo(const std::vector<std::string>& argv);
int run_layout(const std::vector<std::string>& argv);
int run_roundtrip(const std::vector<std::string>& argv);
int run_bench(const std::vector<std::string>& argv);
int run_conformance(const std::vector<std::string>& argv);
int run_calibrate(const std::vector<std::string>& argv);

// The round trip's table; returns whether it passed.
bool print_roundtrip(const harness::RoundtripReport& report, std::ostream& out);

}  // namespace nvfp4kv::cli
