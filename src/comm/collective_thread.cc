#include "comm/collective_thread.h"

#include <chrono>

namespace atl {

struct CollectiveThread::Task {
  std::function<Status()> op;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};

class CollectiveThread::TaskWait final : public CommHandle::Pending {
 public:
  TaskWait(std::shared_ptr<Task> t, double timeout_s, std::string prefix)
      : t_(std::move(t)), timeout_s_(timeout_s), prefix_(std::move(prefix)) {}

  Status Wait() override {
    std::unique_lock<std::mutex> lk(t_->mu);
    auto done = [&] { return t_->done; };
    if (timeout_s_ <= 0) {
      t_->cv.wait(lk, done);
    } else if (!t_->cv.wait_for(lk, std::chrono::duration<double>(timeout_s_), done)) {
      return Status::Unavailable(
          fmt::format("{}: not complete after {} s (a peer is dead, stuck, or did not call it)",
                      prefix_, timeout_s_));
    }
    return t_->status;
  }

 private:
  std::shared_ptr<Task> t_;
  double timeout_s_;
  std::string prefix_;
};

CollectiveThread::~CollectiveThread() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

CommHandle CollectiveThread::Run(std::function<Status()> op, double timeout_s, std::string prefix) {
  auto task = std::make_shared<Task>();
  task->op = std::move(op);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    queue_.push_back(task);
  }
  cv_.notify_all();
  return CommHandle(std::make_unique<TaskWait>(std::move(task), timeout_s, std::move(prefix)));
}

void CollectiveThread::Loop() {
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    Status s = task->op();
    {
      std::lock_guard<std::mutex> lk(task->mu);
      task->status = std::move(s);
      task->done = true;
    }
    task->cv.notify_all();
  }
}

}  // namespace atl
