// Generated ids to client text: complete UTF-8 only (StreamDecoder), and stop strings cut
// out. Text that could still turn into a stop string is held back until it cannot.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace arbiter::server {

class StopTextStream {
 public:
  StopTextStream(const Tokenizer& tok, std::vector<std::string> stops) : dec_(tok), stops_(std::move(stops)) {}
  /// The text that is final after this token (may be empty). Once a stop string appears,
  /// the text before it is returned, stopped() turns true and later calls return "".
  std::string push(int32_t id);
  /// At the end of generation: whatever is still held back.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  StreamDecoder dec_;
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string release(bool final);
};

}  // namespace arbiter::server
