// temb: command-line client for the temb embedding service.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "temb/cli/commands.h"
#include "temb/cli/common.h"

namespace {

constexpr char kUsage[] =
    "usage: temb <command> [flags]\n"
    "  embed   compute embeddings on a server (--target) or in-process "
    "(--local)\n"
    "  bench   load-test a server (closed loop --concurrency, open loop "
    "--rate)\n"
    "  health  grpc.health.v1 check; exit 0 when SERVING\n"
    "  info    the server's version, backend, limits and presets\n"
    "  condition  a model's time conditioning from its diffusers checkpoint "
    "(in process)\n"
    "Run `temb <command> --help` for the command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "embed") return temb::cli::RunEmbed(args);
  if (command == "bench") return temb::cli::RunBench(args);
  if (command == "health") return temb::cli::RunHealth(args);
  if (command == "info") return temb::cli::RunInfo(args);
  if (command == "condition") return temb::cli::RunCondition(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::cout << kUsage;
    return temb::cli::kExitOk;
  }
  std::cerr << (command.empty() ? "missing command\n"
                                : "unknown command '" + command + "'\n")
            << kUsage;
  return temb::cli::kExitUsage;
}
