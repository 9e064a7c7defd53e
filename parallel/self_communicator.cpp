#include "parallel/self_communicator.h"

#include <cstring>
#include <string>
#include <utility>

#include "common/error.h"

namespace linnet {

SelfCommunicator::SelfCommunicator(std::function<void(void*, const void*, std::size_t)> copy, bool capturable)
    : copy_(std::move(copy)), capturable_(capturable) {
  if (!copy_) copy_ = [](void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); };
}

void SelfCommunicator::all_reduce_sum(float*, std::size_t) {}
void SelfCommunicator::all_reduce_sum(double*, std::size_t) {}
void SelfCommunicator::all_reduce_max(float*, std::size_t) {}

void SelfCommunicator::all_gather(const float* send, std::size_t count, float* recv) {
  if (send == recv || count == 0) return;
  copy_(recv, send, count * sizeof(float));
}

void SelfCommunicator::broadcast(void*, std::size_t, int root) {
  if (root != 0) {
    throw Error("broadcast root is not a rank of this group", "SelfCommunicator::broadcast", "root 0 (a group of one)",
                std::to_string(root));
  }
}

}  // namespace linnet
