#include <string>

#include "commands.hpp"

namespace kvarn {

namespace {
std::string& command_line_storage() {
  static std::string s;
  return s;
}
}  // namespace

void set_command_line(int argc, char** argv) {
  std::string& s = command_line_storage();
  s.clear();
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += argv[i];
  }
}

const std::string& command_line() { return command_line_storage(); }

}  // namespace kvarn
