#include "server/text_stream.h"

#include <algorithm>

namespace arbiter::server {

std::string StopTextStream::release(bool final) {
  size_t first = std::string::npos;  // the earliest stop string wins
  for (const std::string& s : stops_) {
    size_t p = s.empty() ? std::string::npos : held_.find(s);
    first = std::min(first, p);
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  size_t keep = 0;  // the longest tail of held_ that starts some stop string
  if (!final)
    for (const std::string& s : stops_)
      for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); k > keep; --k)
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopTextStream::push(int32_t id) {
  if (stopped_) return "";
  held_ += dec_.push(id);
  return release(false);
}

std::string StopTextStream::flush() {
  if (stopped_) return "";
  held_ += dec_.flush();
  return release(true);
}

}  // namespace arbiter::server
