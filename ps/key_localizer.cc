#include "ps/key_localizer.h"

#include <memory>
#include <vector>

#include "ps/kv_worker.h"

namespace chorus::ps {

void PrefetchLocalizer::localize(std::span<const Key> keys, Done done) {
  // The values land in a buffer the completion owns: KvWorker keeps the callback until the
  // operation completed, and no socket reads into the buffer after that.
  auto values = std::make_shared<std::vector<float>>(space_.floatsOf(keys));
  worker_.pull(keys, *values, [values, done = std::move(done)](const node::Status& status) {
    if (done) done(status);
  });
}

}  // namespace chorus::ps
