#include "diaspora/thread_name.hpp"

#include <pthread.h>

namespace diaspora {

void name_this_thread(std::string_view name) noexcept {
  char buf[16] = {};
  name.copy(buf, sizeof buf - 1);  // Linux: at most 15 bytes and the NUL
  pthread_setname_np(pthread_self(), buf);
}

}  // namespace diaspora
