#include "parallel/mailbox.h"

#include <chrono>
#include <climits>
#include <thread>

#include "common/error.h"
#include "parallel/mpi_communicator.h"

namespace linnet {

Mailbox::Mailbox(MPI_Comm comm) {
  LINNET_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  LINNET_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Mailbox::~Mailbox() {
  for (Pending& p : sends_) {
    if (p.request != MPI_REQUEST_NULL) MPI_Request_free(&p.request);  // never wait in a destructor
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void Mailbox::send(int dest, int tag, std::string bytes) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    throw Error("a message of " + std::to_string(bytes.size()) + " bytes (2 GiB at most)",
                "rank " + std::to_string(rank_) + " to rank " + std::to_string(dest));
  }
  Pending& p = sends_.emplace_back();
  p.bytes = std::move(bytes);
  LINNET_MPI_CHECK(
      MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, dest, tag, comm_, &p.request));
}

bool Mailbox::reap() {
  bool any = false;
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    LINNET_MPI_CHECK(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
    if (done) {
      it = sends_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  return any;
}

bool Mailbox::receive(int tag, std::string& bytes, int* from, int source) {
  int flag = 0;
  MPI_Status st;
  LINNET_MPI_CHECK(MPI_Iprobe(source, tag, comm_, &flag, &st));
  if (!flag) return false;
  int count = 0;
  LINNET_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
  bytes.assign(static_cast<size_t>(count), '\0');
  LINNET_MPI_CHECK(MPI_Recv(bytes.data(), count, MPI_BYTE, st.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE));
  if (from) *from = st.MPI_SOURCE;
  return true;
}

void Mailbox::discard(int tag) noexcept {
  for (int flag = 1; flag;) {
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &flag, &st) != MPI_SUCCESS) return;
    if (!flag) return;
    int count = 0;
    if (MPI_Get_count(&st, MPI_BYTE, &count) != MPI_SUCCESS) return;
    std::string drop(static_cast<size_t>(count), '\0');
    if (MPI_Recv(drop.data(), count, MPI_BYTE, st.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
  }
}

void polled_broadcast(MPI_Comm comm, void* data, int bytes, int root, bool idle) {
  MPI_Request req;
  LINNET_MPI_CHECK(MPI_Ibcast(data, bytes, MPI_BYTE, root, comm, &req));
  int done = 0;
  for (int spins = 0; !done; ++spins) {
    LINNET_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (!done && (idle || spins > 20000)) std::this_thread::sleep_for(std::chrono::microseconds(idle ? 1000 : 50));
  }
}

}  // namespace linnet
