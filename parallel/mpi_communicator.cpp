#include "parallel/mpi_communicator.h"

#include <algorithm>
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

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) {
  LINNET_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  LINNET_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  LINNET_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  LINNET_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  const char* skip = std::getenv("LINNET_SKIP_COUNT_CHECK");
  check_counts_ = !(skip && std::string(skip) == "1");
  watch_ = GroupWatch(comm_, std::move(name));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::agree_on_count(std::size_t count, const char* op, int64_t number) {
  if (!check_counts_ || size_ == 1) return;
  int64_t v[2] = {static_cast<int64_t>(count), -static_cast<int64_t>(count)};
  MPI_Request req;
  LINNET_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MAX, comm_, &req));
  wait(req, op, number);
  if (v[0] != -v[1]) {
    throw Error("ranks disagree on the element count of a collective", op,
                "the same count on every rank",
                "counts from " + std::to_string(-v[1]) + " to " + std::to_string(v[0]) +
                    " (this rank: " + std::to_string(count) + ")");
  }
}

void MpiCommunicator::all_reduce(void* data, std::size_t count, MPI_Datatype type, MPI_Op op, const char* name) {
  if (size_ == 1) return;
  const int64_t n = watch_.enter();
  agree_on_count(count, name, n);
  MPI_Request req;
  LINNET_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, to_int_count(count, name), type, op, comm_, &req));
  wait(req, name, n);
}

void MpiCommunicator::all_reduce_sum(float* data, std::size_t count) {
  all_reduce(data, count, MPI_FLOAT, MPI_SUM, "all_reduce_sum");
}

void MpiCommunicator::all_reduce_sum(double* data, std::size_t count) {
  all_reduce(data, count, MPI_DOUBLE, MPI_SUM, "all_reduce_sum");
}

void MpiCommunicator::all_reduce_max(float* data, std::size_t count) {
  all_reduce(data, count, MPI_FLOAT, MPI_MAX, "all_reduce_max");
}

void MpiCommunicator::all_gather(const float* send, std::size_t count, float* recv) {
  const int c = to_int_count(count, "all_gather");
  if (size_ == 1) {
    if (recv != send) std::copy(send, send + count, recv);
    return;
  }
  const int64_t n = watch_.enter();
  agree_on_count(count, "all_gather", n);
  MPI_Request req;
  LINNET_MPI_CHECK(MPI_Iallgather(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, comm_, &req));
  wait(req, "all_gather", n);
}

void MpiCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  if (size_ == 1) return;
  const int64_t n = watch_.enter();
  agree_on_count(bytes, "broadcast", n);
  MPI_Request req;
  LINNET_MPI_CHECK(MPI_Ibcast(data, to_int_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &req));
  wait(req, "broadcast", n);
}

void MpiCommunicator::barrier() {
  if (size_ == 1) return;
  collective("barrier", [&](MPI_Request* req) { return MPI_Ibarrier(comm_, req); });
}

void MpiCommunicator::collective(const char* op, const std::function<int(MPI_Request*)>& start) {
  const int64_t n = watch_.enter();
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = start(&req);
  if (rc != MPI_SUCCESS) detail::mpi_check(rc, op, __FILE__, __LINE__);
  wait(req, op, n);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key, std::string name) const {
  MPI_Comm sub = MPI_COMM_NULL;
  LINNET_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  auto out = std::make_unique<MpiCommunicator>(sub, std::move(name));
  MPI_Comm_free(&sub);
  return out;
}

MpiGroups make_mpi_groups(int tp_size) {
  MpiGroups g;
  g.world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world");
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
  g.tp = g.world->split(w.dp_rank, w.tp_rank, "tp group");
  g.dp = g.world->split(w.tp_rank, w.dp_rank, "dp group");
  return g;
}

}  // namespace linnet
