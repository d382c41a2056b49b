#include "parallel/launcher.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/check.h"
#include "core/logging.h"
#include "deepinfer/error.h"

extern char** environ;

namespace deepinfer::parallel {
namespace fs = std::filesystem;

RendezvousDir::RendezvousDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/deepinfer-ranks-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) DI_THROW(InvalidArgument, "cannot create a rendezvous directory '", templ, "': ", std::strerror(errno));
  path_ = buf.data();
}

RendezvousDir::~RendezvousDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

namespace {
std::string describe_status(int rank, pid_t pid, int status) {
  if (WIFEXITED(status)) return detail::str_cat("rank ", rank, " (pid ", pid, ") exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return detail::str_cat("rank ", rank, " (pid ", pid, ") was killed by signal ", WTERMSIG(status));
  return detail::str_cat("rank ", rank, " (pid ", pid, ") stopped");
}
}  // namespace

WorkerProcesses::WorkerProcesses(const WorkerLaunch& L) {
  if (L.command.empty()) DI_THROW(InvalidArgument, "parallel launch: no worker command");
  if (L.world_size < 1) DI_THROW(InvalidArgument, "parallel launch: world size ", L.world_size);
  // The environment every worker gets: ours, minus any rank variables, plus the launch's.
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (name.rfind("DEEPINFER_RANK", 0) == 0 || name == "DEEPINFER_WORLD_SIZE" || name == "DEEPINFER_LOCAL_RANK" ||
        name == "DEEPINFER_RENDEZVOUS_DIR")
      continue;
    base.push_back(kv);
  }
  for (const auto& [k, v] : L.env) base.push_back(k + "=" + v);
  base.push_back("DEEPINFER_WORLD_SIZE=" + std::to_string(L.world_size));
  base.push_back("DEEPINFER_RENDEZVOUS_DIR=" + L.rendezvous_dir);
  std::vector<char*> argv;
  for (const std::string& a : L.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (int r = 1; r < L.world_size; ++r) {
    std::vector<std::string> env = base;
    env.push_back("DEEPINFER_RANK=" + std::to_string(r));
    env.push_back("DEEPINFER_LOCAL_RANK=" + std::to_string(r));
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
      for (pid_t p : pids_) kill(p, SIGKILL);
      for (pid_t p : pids_) waitpid(p, nullptr, 0);
      pids_.clear();
      DI_THROW(InvalidArgument, "parallel launch: cannot start rank ", r, " as '", L.command[0], "': ", std::strerror(rc));
    }
    pids_.push_back(pid);
  }
  status_.assign(pids_.size(), 0);
  reaped_.assign(pids_.size(), false);
}

std::optional<std::string> WorkerProcesses::exited() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (!reaped_[i]) {
      int st = 0;
      if (waitpid(pids_[i], &st, WNOHANG) == pids_[i]) reaped_[i] = true, status_[i] = st;
    }
    if (reaped_[i]) return describe_status(int(i) + 1, pids_[i], status_[i]);
  }
  return std::nullopt;
}

bool WorkerProcesses::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (reaped_[i]) continue;
      int st = 0;
      if (waitpid(pids_[i], &st, WNOHANG) == pids_[i]) reaped_[i] = true, status_[i] = st;
      else all = false;
    }
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

WorkerProcesses::~WorkerProcesses() {
  if (wait(std::chrono::milliseconds(5000))) return;
  for (size_t i = 0; i < pids_.size(); ++i)
    if (!reaped_[i]) kill(pids_[i], SIGTERM);
  if (wait(std::chrono::milliseconds(2000))) return;
  for (size_t i = 0; i < pids_.size(); ++i)
    if (!reaped_[i]) {
      DI_WARN("parallel launch: rank ", i + 1, " (pid ", pids_[i], ") did not exit; killing it");
      kill(pids_[i], SIGKILL);
      waitpid(pids_[i], nullptr, 0);
    }
}

}  // namespace deepinfer::parallel
