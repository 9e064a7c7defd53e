#include "parallel/mpi_communicator.h"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.h"

namespace linnet {
namespace detail {
void mpi_check(int rc, const char* expr, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  throw Error(std::string(expr) + " failed: " + std::string(buf, len),
              std::string(file) + ":" + std::to_string(line));
}
}  // namespace detail

namespace {
int to_int_count(std::size_t count, const char* op) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw Error("collective too large for one MPI call", op, "<= INT_MAX elements",
                std::to_string(count));
  }
  return static_cast<int>(count);
}
}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  LINNET_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  LINNET_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  LINNET_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  LINNET_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  const char* skip = std::getenv("LINNET_SKIP_COUNT_CHECK");
  check_counts_ = !(skip && std::string(skip) == "1");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::agree_on_count(std::size_t count, const char* op) {
  if (!check_counts_ || size_ == 1) return;
  int64_t v[2] = {static_cast<int64_t>(count), -static_cast<int64_t>(count)};
  LINNET_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MAX, comm_));
  if (v[0] != -v[1]) {
    throw Error("ranks disagree on the element count of a collective", op,
                "the same count on every rank",
                "counts from " + std::to_string(-v[1]) + " to " + std::to_string(v[0]) +
                    " (this rank: " + std::to_string(count) + ")");
  }
}

void MpiCommunicator::all_reduce_sum(float* data, std::size_t count) {
  agree_on_count(count, "all_reduce_sum");
  if (size_ == 1) return;
  LINNET_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, to_int_count(count, "all_reduce_sum"),
                                 MPI_FLOAT, MPI_SUM, comm_));
}

void MpiCommunicator::all_reduce_sum(double* data, std::size_t count) {
  agree_on_count(count, "all_reduce_sum");
  if (size_ == 1) return;
  LINNET_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, to_int_count(count, "all_reduce_sum"),
                                 MPI_DOUBLE, MPI_SUM, comm_));
}

void MpiCommunicator::all_reduce_max(float* data, std::size_t count) {
  agree_on_count(count, "all_reduce_max");
  if (size_ == 1) return;
  LINNET_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, to_int_count(count, "all_reduce_max"),
                                 MPI_FLOAT, MPI_MAX, comm_));
}

void MpiCommunicator::all_gather(const float* send, std::size_t count, float* recv) {
  agree_on_count(count, "all_gather");
  const int n = to_int_count(count, "all_gather");
  LINNET_MPI_CHECK(MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_));
}

void MpiCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  agree_on_count(bytes, "broadcast");
  if (size_ == 1) return;
  LINNET_MPI_CHECK(MPI_Bcast(data, to_int_count(bytes, "broadcast"), MPI_BYTE, root, comm_));
}

void MpiCommunicator::barrier() { LINNET_MPI_CHECK(MPI_Barrier(comm_)); }

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm sub = MPI_COMM_NULL;
  LINNET_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  auto out = std::make_unique<MpiCommunicator>(sub);
  MPI_Comm_free(&sub);
  return out;
}

MpiGroups make_mpi_groups(int tp_size) {
  MpiGroups g;
  g.world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  MPI_Comm node = MPI_COMM_NULL;
  LINNET_MPI_CHECK(
      MPI_Comm_split_type(g.world->comm(), MPI_COMM_TYPE_SHARED, g.world->rank(), MPI_INFO_NULL, &node));
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  g.world_config =
      WorldConfig::make(g.world->rank(), g.world->size(), tp_size, local_rank, local_size);
  const WorldConfig& w = g.world_config;
  g.tp = g.world->split(w.dp_rank, w.tp_rank);
  g.dp = g.world->split(w.tp_rank, w.dp_rank);
  return g;
}

}  // namespace linnet
