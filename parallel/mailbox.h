// Mailbox: the messages a run's ranks send each other outside the engine's collectives
// (driver/run_relay.h's stop signals, heartbeats and finished records; driver/
// serve_loop.cpp's orders and reports between world rank 0 and the dp groups' first
// ranks). Over a private duplicate of the communicator, so its tags meet no one else's,
// with MPI errors returned rather than fatal (a dead peer is an Error, not an abort).
// Sends never block: two ranks may send each other large messages at once
// (rendezvous), so each keeps receiving while its own sends complete. Only the thread
// that made the mailbox may use it (MPI_THREAD_FUNNELED).
#pragma once

#include <list>
#include <string>

#include <mpi.h>

namespace linnet {

/// Non-blocking point-to-point messages of bytes on a duplicate of a communicator.
class Mailbox {
 public:
  static constexpr int kAnySource = MPI_ANY_SOURCE;

  /// Collective over `comm` (MPI_Comm_dup); every rank makes its mailboxes in one order.
  /// @throws Error when MPI fails.
  explicit Mailbox(MPI_Comm comm);
  /// Frees unfinished sends without waiting for them and the duplicate (never blocks).
  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Queues `bytes` for rank `dest` under `tag` (MPI_Isend; the bytes are kept until
  /// sent) and returns at once.
  /// @throws Error for a message of 2 GiB or more, or when MPI fails.
  void send(int dest, int tag, std::string bytes);
  /// Completes the sends that have finished. True when any did.
  /// @throws Error when MPI fails.
  bool reap();
  /// Whether a send is still in flight.
  bool sending() const { return !sends_.empty(); }

  /// Takes the next message under `tag` from `source` (kAnySource: any rank) if one has
  /// arrived (MPI_Iprobe, then MPI_Recv of its size): its bytes, and its sender in
  /// `*from`. False, `bytes` untouched, when none has.
  /// @throws Error when MPI fails.
  bool receive(int tag, std::string& bytes, int* from = nullptr, int source = kAnySource);
  /// Throws away every message under `tag` that has arrived; never throws (for destructors).
  void discard(int tag) noexcept;

 private:
  struct Pending {
    std::string bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::list<Pending> sends_;  // stable addresses while MPI reads them
};

/// MPI_Ibcast of `bytes` bytes at `data` from `root` over `comm`, completed by polling: a
/// rank with nothing to run (`idle`) sleeps 1 ms between tests instead of spinning in a
/// blocking broadcast (Open MPI busy-waits), which would take a core from the ranks that
/// compute; a busy one spins a while, then sleeps 50 us. Collective over `comm`.
/// @throws Error when MPI fails.
void polled_broadcast(MPI_Comm comm, void* data, int bytes, int root, bool idle);

}  // namespace linnet
