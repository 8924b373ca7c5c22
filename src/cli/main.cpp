// nvfp4kv: the command-line front end. Each subcommand validates its arguments
// and calls the library. Exit codes (docs/cli-json.md): 0 success, 1 a negative
// verdict (rejected layout, disagreement, failed check), 2 unusable input (bad
// usage, refused text, files or sizes), 3 not possible here (no GPU, no CUDA).
// Reports, whatever their verdict, go to stdout; usage errors to stderr.
#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "nvfp4kv/core/names.hpp"

namespace {

const std::vector<std::string> kCommands = {"demo", "layout", "roundtrip", "bench", "conformance", "calibrate", "help"};

void usage(std::FILE* to) {
  std::fputs(
      "nvfp4kv: NVFP4 KV-cache layouts, quantization and kernels\n"
      "\n"
      "usage:\n"
      "  nvfp4kv demo [--tokens T] [--seed S] [--cpu-only]   quantize a model-like KV tensor, check layouts, round-trip\n"
      "  nvfp4kv layout presets                     list the built-in layouts and their verdicts\n"
      "  nvfp4kv layout show LAYOUT [sizes]         regions, sizes, capacity and a byte map of one page\n"
      "  nvfp4kv layout check LAYOUT [sizes]        prove a layout sound or say where it breaks\n"
      "  nvfp4kv layout compare WRITER READER [sizes]  do two descriptions place every element alike?\n"
      "  nvfp4kv layout plan --layers L --kv-heads H --head-dim D (--memory BYTES | --pages P) [options]\n"
      "                                             size an allocation: the native layout or --layout LAYOUT\n"
      "  nvfp4kv roundtrip --layout LAYOUT [sizes]  store then gather on the CPU reference and the GPU\n"
      "  nvfp4kv conformance gen --layout LAYOUT [sizes] --out DIR   inputs for an engine's own writer and reader\n"
      "  nvfp4kv conformance check-write --layout LAYOUT --dir DIR --cache BUFFER=FILE ...   check its writer\n"
      "  nvfp4kv conformance check-read --layout LAYOUT --dir DIR (--k FILE --v FILE | --out FILE)   its reader\n"
      "  nvfp4kv calibrate --samples FILE.npz --bits B --out FILE   per-layer cache format from K/V samples\n"
      "  nvfp4kv bench decode [options]             time decode attention on the GPU\n"
      "  nvfp4kv --version                          the version, its CUDA version and GPU targets (or CPU only)\n"
      "\n"
      "nvfp4kv COMMAND --help lists a command's options. LAYOUT is a preset name or a JSON file\n"
      "(docs/layouts.md); sizes: --layers --pages --heads --head-dim --tokens-per-page where the layout\n"
      "leaves them open. Every command but demo and bench takes --json (docs/cli-json.md).\n"
      "exit codes: 0 success; 1 a negative verdict (rejected, disagree, failed check); 2 unusable input\n"
      "(usage, layout text, files or sizes refused); 3 not possible here (no GPU, built without CUDA).\n",
      to);
}

}  // namespace

// The command's runner, or nullptr for an unknown command.
int (*runner(const std::string& cmd))(const std::vector<std::string>&) {
  using namespace nvfp4kv::cli;
  if (cmd == "demo") return run_demo;
  if (cmd == "layout") return run_layout;
  if (cmd == "roundtrip") return run_roundtrip;
  if (cmd == "bench") return run_bench;
  if (cmd == "conformance") return run_conformance;
  if (cmd == "calibrate") return run_calibrate;
  return nullptr;
}

int main(int argc, char** argv) {
  using namespace nvfp4kv::cli;
  if (argc < 2) {
    usage(stderr);
    return kExitUsage;
  }
  std::string cmd = argv[1];
  std::vector<std::string> rest(argv + 2, argv + argc);
  try {
    if (cmd == "--version" || cmd == "version") {
      // The version, and what this build holds: its CUDA version and GPU targets, or CPU only.
      std::cout << NVFP4KV_BUILD_INFO << "\n";
      return kExitOk;
    }
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      if (rest.empty()) {
        usage(stdout);
        return kExitOk;
      }
      cmd = rest[0];  // nvfp4kv help layout check: that command's --help
      rest.erase(rest.begin());
      rest.push_back("--help");
    }
    if (const auto run = runner(cmd)) return run(rest);
    std::cerr << "nvfp4kv: unknown command " << nvfp4kv::quote_text(cmd) << nvfp4kv::did_you_mean(cmd, kCommands)
              << "; nvfp4kv --help lists the commands\n";
    return kExitUsage;
  } catch (const UsageError& e) {
    std::cerr << "nvfp4kv " << cmd << ": " << e.what() << "\n";
    return kExitUsage;
  } catch (const nvfp4kv::LayoutError& e) {  // layout text or sizes refused
    std::cerr << "nvfp4kv " << cmd << ": " << e.what() << "\n";
    return kExitUsage;
  } catch (const nvfp4kv::ArgumentError& e) {  // files or arguments refused
    std::cerr << "nvfp4kv " << cmd << ": " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "nvfp4kv " << cmd << ": error: " << e.what() << "\n";
    return kExitVerdict;
  }
}
