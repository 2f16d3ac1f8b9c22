// Sampling profiler: every thread of the process is interrupted at a fixed wall-clock period
// and its instruction address recorded; addresses resolve to functions and kernel categories.
#include "bench/sampling_profiler.hpp"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>
#include <link.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>

#include "kernels/check.hpp"

namespace actorpipe::bench {

// ---------------------------------------------------------------------------------------
// Categories

std::string_view to_string(KernelCategory c) {
  switch (c) {
    case KernelCategory::gemm:
      return "gemm";
    case KernelCategory::attention:
      return "attention";
    case KernelCategory::layernorm:
      return "layernorm";
    case KernelCategory::gelu:
      return "gelu";
    case KernelCategory::crossentropy:
      return "crossentropy";
    case KernelCategory::embedding:
      return "embedding";
    case KernelCategory::optimizer:
      return "optimizer";
    case KernelCategory::elementwise:
      return "elementwise";
    case KernelCategory::bias:
      return "bias";
    case KernelCategory::convert:
      return "convert";
    case KernelCategory::threads:
      return "threads";
    case KernelCategory::blocked:
      return "blocked";
    case KernelCategory::libc:
      return "libc";
    case KernelCategory::other:
      return "other";
  }
  return "other";
}

bool category_from_string(std::string_view name, KernelCategory& out) {
  for (int c = 0; c < kNumKernelCategories; ++c) {
    if (to_string(static_cast<KernelCategory>(c)) == name) {
      out = static_cast<KernelCategory>(c);
      return true;
    }
  }
  return false;
}

namespace {

bool contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

std::string_view basename(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// Source files of the kernels and of the engine's optimizer step (none of them is compiled into a
// unity batch, which would name the batch's generated unit instead).
KernelCategory classify_file(std::string_view file, bool& known) {
  struct Entry {
    std::string_view file;
    KernelCategory category;
  };
  static constexpr std::array<Entry, 13> kFiles = {{
      {"gemm.cpp", KernelCategory::gemm},
      {"gemm_recorder.cpp", KernelCategory::gemm},
      {"attention.cpp", KernelCategory::attention},
      {"layernorm.cpp", KernelCategory::layernorm},
      {"gelu.cpp", KernelCategory::gelu},
      {"crossentropy.cpp", KernelCategory::crossentropy},
      {"encoder.cpp", KernelCategory::embedding},
      {"optimizer.cpp", KernelCategory::optimizer},
      {"layer_optimizer.cpp", KernelCategory::optimizer},
      {"elementwise.cpp", KernelCategory::elementwise},
      {"matmul.cpp", KernelCategory::bias},
      {"bf16.cpp", KernelCategory::convert},
      {"context.cpp", KernelCategory::threads},
  }};
  const std::string_view base = basename(file);
  for (const Entry& e : kFiles) {
    if (base == e.file) {
      known = true;
      return e.category;
    }
  }
  known = false;
  return KernelCategory::other;
}

KernelCategory classify_name(std::string_view name) {
  struct Entry {
    std::string_view key;
    KernelCategory category;
  };
  // First match wins: kernel entry points (their lambdas carry the enclosing function's
  // name) before the thread pool that runs them.
  static constexpr std::array<Entry, 26> kNames = {{
      {"attention_", KernelCategory::attention},
      {"layernorm_", KernelCategory::layernorm},
      {"gelu_", KernelCategory::gelu},
      {"crossentropy_", KernelCategory::crossentropy},
      {"count_targets", KernelCategory::crossentropy},
      {"sum_losses", KernelCategory::crossentropy},
      {"encoder_", KernelCategory::embedding},
      {"adamw_update", KernelCategory::optimizer},
      {"sgd_update", KernelCategory::optimizer},
      {"grad_sumsq", KernelCategory::optimizer},
      {"clip_scale", KernelCategory::optimizer},
      {"optimizer_update", KernelCategory::optimizer},
      {"reduce_tied_grads", KernelCategory::optimizer},
      {"residual_", KernelCategory::elementwise},
      {"accumulate", KernelCategory::elementwise},
      {"fill_zero", KernelCategory::elementwise},
      {"scale_inplace", KernelCategory::elementwise},
      {"matmul_", KernelCategory::bias},
      {"to_bf16", KernelCategory::convert},
      {"convert_to_bf16", KernelCategory::convert},
      {"gemm", KernelCategory::gemm},
      {"ThreadPool", KernelCategory::threads},
      {"run_chunks", KernelCategory::threads},
      {"ChunkFn", KernelCategory::threads},
      {"run_tasks", KernelCategory::threads},
      {"TaskFn", KernelCategory::threads},
  }};
  for (const Entry& e : kNames)
    if (contains(name, e.key)) return e.category;
  return KernelCategory::other;
}

}  // namespace

KernelCategory classify(std::string_view demangled, std::string_view source_file,
                        std::string_view library) {
  if (!library.empty()) {
    const std::string_view lib = basename(library);
    if (contains(lib, "blas") || contains(lib, "libdnnl")) return KernelCategory::gemm;
    if (contains(lib, "libc.so") || contains(lib, "libstdc++") || contains(lib, "libm.so") ||
        contains(lib, "libgcc") || contains(lib, "ld-linux"))
      return KernelCategory::libc;
    return KernelCategory::other;
  }
  if (!source_file.empty()) {
    bool known = false;
    const KernelCategory c = classify_file(source_file, known);
    if (known) return c;
  }
  return classify_name(demangled);
}

// ---------------------------------------------------------------------------------------
// Sampler: a SIGPROF handler writes into a fixed buffer; one timer per thread.

namespace {

constexpr int kMaxThreads = 256;

struct SamplerState {
  std::atomic<bool> armed{false};
  std::atomic<size_t> next{0};
  ProfileSample* buf = nullptr;
  size_t capacity = 0;
  pid_t tids[kMaxThreads] = {};
  int ntids = 0;
};
SamplerState g_sampler;
std::atomic<bool> g_sampler_busy{false};

uintptr_t interrupted_pc(const ucontext_t* u) {
#if defined(__x86_64__)
  return static_cast<uintptr_t>(u->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(u->uc_mcontext.pc);
#else
  (void)u;
  return 0;
#endif
}

// A blocking system call interrupted by the signal is restarted by re-executing `syscall`
// (the kernel rewinds the PC to it) or returns -EINTR right after it; a thread woken from
// one but still waiting for a CPU also sits right after it. All three count as blocked.
bool interrupted_in_syscall(uintptr_t pc) {
#if defined(__x86_64__)
  const auto* at = reinterpret_cast<const unsigned char*>(pc);
  if (at[0] == 0x0f && at[1] == 0x05) return true;
  if ((pc & 0xfff) < 2) return false;  // do not read across into a previous page
  return at[-2] == 0x0f && at[-1] == 0x05;
#else
  (void)pc;
  return false;
#endif
}

void on_sigprof(int, siginfo_t*, void* uc) {
  if (!g_sampler.armed.load(std::memory_order_acquire)) return;
  const int saved_errno = errno;
  const auto tid = static_cast<pid_t>(syscall(SYS_gettid));
  int slot = -1;
  for (int i = 0; i < g_sampler.ntids; ++i)
    if (g_sampler.tids[i] == tid) slot = i;
  const auto* u = static_cast<const ucontext_t*>(uc);
  const uintptr_t pc = interrupted_pc(u);
  const size_t k = g_sampler.next.fetch_add(1, std::memory_order_relaxed);
  if (k < g_sampler.capacity)
    g_sampler.buf[k] = ProfileSample{slot, pc != 0 && interrupted_in_syscall(pc), pc};
  errno = saved_errno;
}

void install_handler_once() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigprof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    // Stays installed for the life of the process: a signal still in flight after the
    // timers are deleted must not meet SIGPROF's default action (termination).
    return sigaction(SIGPROF, &sa, nullptr) == 0;
  }();
  AP_CHECK(installed, "sigaction(SIGPROF) failed");
}

std::vector<pid_t> list_threads() {
  std::vector<pid_t> tids;
  const auto self = static_cast<pid_t>(syscall(SYS_gettid));
  tids.push_back(self);
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) {
      const long t = std::strtol(e->d_name, nullptr, 10);
      if (t > 0 && t != self) tids.push_back(static_cast<pid_t>(t));
    }
    closedir(d);
  }
  return tids;
}

}  // namespace

SamplingProfiler::SamplingProfiler(size_t capacity) : buf_(capacity) {}

SamplingProfiler::~SamplingProfiler() {
  if (running_) stop();
}

bool SamplingProfiler::start(std::chrono::microseconds period, std::vector<pid_t> tids) {
  AP_CHECK(!running_, "profiler already running");
  bool expected = false;
  AP_CHECK(g_sampler_busy.compare_exchange_strong(expected, true),
           "another SamplingProfiler is running");
  install_handler_once();
  tids_ = tids.empty() ? list_threads() : std::move(tids);
  if (tids_.size() > static_cast<size_t>(kMaxThreads)) tids_.resize(kMaxThreads);
  g_sampler.buf = buf_.data();
  g_sampler.capacity = buf_.size();
  g_sampler.next.store(0);
  g_sampler.ntids = static_cast<int>(tids_.size());
  std::copy(tids_.begin(), tids_.end(), g_sampler.tids);
  g_sampler.armed.store(true, std::memory_order_release);
  running_ = true;

  const long ns = static_cast<long>(period.count()) * 1000;
  itimerspec its{};
  its.it_interval.tv_sec = ns / 1000000000;
  its.it_interval.tv_nsec = ns % 1000000000;
  its.it_value = its.it_interval;
  for (pid_t tid : tids_) {
    sigevent sev{};
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev._sigev_un._tid = tid;
    timer_t timer{};
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer) != 0) {
      stop();
      return false;
    }
    timers_.push_back(timer);
    if (timer_settime(timer, 0, &its, nullptr) != 0) {
      stop();
      return false;
    }
  }
  return true;
}

void SamplingProfiler::stop() {
  if (!running_) return;
  for (void* t : timers_) timer_delete(static_cast<timer_t>(t));
  timers_.clear();
  g_sampler.armed.store(false, std::memory_order_release);
  taken_ = g_sampler.next.load();
  g_sampler.buf = nullptr;
  g_sampler.capacity = 0;
  running_ = false;
  g_sampler_busy.store(false);
}

std::span<const ProfileSample> SamplingProfiler::samples() const {
  return {buf_.data(), std::min(taken_, buf_.size())};
}

size_t SamplingProfiler::dropped() const {
  return taken_ > buf_.size() ? taken_ - buf_.size() : 0;
}

// ---------------------------------------------------------------------------------------
// Symbolizer

namespace {

struct FuncSym {
  uintptr_t start = 0;
  uintptr_t size = 0;
  std::string mangled;
  std::string file;  // local symbols: the source file named by the preceding STT_FILE
};

std::string demangle(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return mangled;
  std::string out(d);
  std::free(d);
  return out;
}

uintptr_t program_load_bias() {
  uintptr_t bias = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        *static_cast<uintptr_t*>(data) = static_cast<uintptr_t>(info->dlpi_addr);
        return 1;  // the first object is the program
      },
      &bias);
  return bias;
}

std::vector<FuncSym> read_program_functions() {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  std::vector<char> elf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<FuncSym> funcs;
  if (elf.size() < sizeof(Elf64_Ehdr) || std::memcmp(elf.data(), ELFMAG, SELFMAG) != 0 ||
      elf[EI_CLASS] != ELFCLASS64)
    return funcs;
  Elf64_Ehdr eh;
  std::memcpy(&eh, elf.data(), sizeof eh);
  if (eh.e_shoff == 0 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
      eh.e_shoff + static_cast<size_t>(eh.e_shnum) * sizeof(Elf64_Shdr) > elf.size())
    return funcs;
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  std::memcpy(sh.data(), elf.data() + eh.e_shoff, sh.size() * sizeof(Elf64_Shdr));
  const uintptr_t bias = program_load_bias();
  for (const Elf64_Shdr& s : sh) {
    if (s.sh_type != SHT_SYMTAB || s.sh_link >= sh.size()) continue;
    const Elf64_Shdr& strs = sh[s.sh_link];
    if (s.sh_offset + s.sh_size > elf.size() || strs.sh_offset + strs.sh_size > elf.size())
      continue;
    const char* names = elf.data() + strs.sh_offset;
    const size_t n = s.sh_size / sizeof(Elf64_Sym);
    std::string file;
    for (size_t i = 0; i < n; ++i) {
      Elf64_Sym sym;
      std::memcpy(&sym, elf.data() + s.sh_offset + i * sizeof(Elf64_Sym), sizeof sym);
      if (sym.st_name >= strs.sh_size) continue;
      const char* name = names + sym.st_name;
      const int type = ELF64_ST_TYPE(sym.st_info);
      if (type == STT_FILE) {
        file = name;
      } else if ((type == STT_FUNC || type == STT_GNU_IFUNC) && sym.st_shndx != SHN_UNDEF &&
                 sym.st_size > 0) {
        const bool local = ELF64_ST_BIND(sym.st_info) == STB_LOCAL;
        funcs.push_back({bias + sym.st_value, sym.st_size, name, local ? file : std::string()});
      }
    }
  }
  std::sort(funcs.begin(), funcs.end(),
            [](const FuncSym& a, const FuncSym& b) { return a.start < b.start; });
  return funcs;
}

}  // namespace

// True when pc lies in an executable mapping backed by no file (/proc/self/maps, read now: the
// generated code exists by the time samples are resolved).
static bool in_anonymous_code(uintptr_t pc) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return false;
  char line[512];
  bool anonymous_code = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0, offset = 0, inode = 0;
    char perms[8] = {};
    char dev[16] = {};
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &lo, &hi, perms, &offset, dev, &inode,
                    &path_at) < 6)
      continue;
    if (pc < lo || pc >= hi) continue;
    const bool no_file = inode == 0 && (line[path_at] == '\n' || line[path_at] == '\0');
    anonymous_code = perms[2] == 'x' && no_file;
    break;
  }
  std::fclose(f);
  return anonymous_code;
}

struct Symbolizer::Impl {
  std::vector<FuncSym> funcs;
  std::unordered_map<uintptr_t, ResolvedSymbol> by_start;  // program functions
  std::map<std::string, ResolvedSymbol> by_library;        // other addresses, per library
};

Symbolizer::Symbolizer() : impl_(std::make_unique<Impl>()) {
  impl_->funcs = read_program_functions();
}

Symbolizer::~Symbolizer() = default;

bool Symbolizer::has_program_symbols() const {
  return !impl_->funcs.empty();
}

const ResolvedSymbol& Symbolizer::resolve(uintptr_t pc) {
  const auto& f = impl_->funcs;
  auto it = std::upper_bound(f.begin(), f.end(), pc,
                             [](uintptr_t a, const FuncSym& s) { return a < s.start; });
  if (it != f.begin()) {
    const FuncSym& s = *std::prev(it);
    if (pc < s.start + s.size) {
      auto [slot, fresh] = impl_->by_start.try_emplace(s.start);
      if (fresh) {
        slot->second.name = demangle(s.mangled);
        slot->second.where = s.file;
        slot->second.category = classify(slot->second.name, s.file, {});
      }
      return slot->second;
    }
  }
  // Shared libraries: resolved per library (dladdr's nearest exported symbol would be
  // misleading for their many local functions).
  Dl_info info{};
  std::string lib = "?";
  if (dladdr(reinterpret_cast<void*>(pc), &info) != 0 && info.dli_fname != nullptr)
    lib = info.dli_fname;
  else if (in_anonymous_code(pc)) {
    // executable memory of no file: code generated at run time, which in this program only
    // oneDNN does (its bf16 matmul kernels)
    auto [slot, fresh] = impl_->by_library.try_emplace("[jit]");
    if (fresh) {
      slot->second.name = "[JIT code: oneDNN's matmul kernels]";
      slot->second.where = "anonymous executable memory";
      slot->second.category = KernelCategory::gemm;
    }
    return slot->second;
  }
  auto [slot, fresh] = impl_->by_library.try_emplace(lib);
  if (fresh) {
    slot->second.name = lib == "?" ? std::string("?") : fmt::format("[{}]", basename(lib));
    slot->second.where = lib;
    slot->second.category = lib == "?" ? KernelCategory::other : classify({}, {}, lib);
  }
  return slot->second;
}

// ---------------------------------------------------------------------------------------
// Report

std::string short_name(const std::string& demangled) {
  std::string s = demangled;
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  if (contains(s, "ThreadPool::ThreadPool(")) return "actorpipe::ThreadPool worker thread";
  // A kernel's chunk or task: ChunkFn::ChunkFn<actorpipe::gelu_forward(...)::{lambda...}>...
  for (const auto& [wrapper, what] :
       {std::pair<std::string, std::string>{"ChunkFn::ChunkFn<", " (parallel chunk)"},
        {"TaskFn::TaskFn<", " (parallel task)"}})
    if (const size_t at = s.find(wrapper); at != std::string::npos) {
      const size_t begin = at + wrapper.size();
      const size_t end = s.find('(', begin);
      if (end != std::string::npos) return s.substr(begin, end - begin) + what;
    }
  const size_t paren = s.find('(');
  if (paren != std::string::npos && paren > 0) s.erase(paren);
  return s;
}

ProfileReport summarize_profile(const SamplingProfiler& prof, Symbolizer& sym, int steps,
                                double wall_ms, std::chrono::microseconds period, size_t top) {
  ProfileReport r;
  r.steps = std::max(1, steps);
  r.step_ms = wall_ms / r.steps;
  r.period_ms = static_cast<double>(period.count()) / 1000.0;
  r.dropped = prof.dropped();
  const size_t nthreads = prof.threads().size();
  r.workers = static_cast<int>(nthreads) - 1;
  // counts[thread][category] and per-thread totals.
  std::vector<std::array<size_t, kNumKernelCategories>> counts(nthreads);
  for (auto& c : counts) c.fill(0);
  std::vector<size_t> totals(nthreads, 0);
  std::unordered_map<const ResolvedSymbol*, size_t> per_symbol;
  const ResolvedSymbol blocked{"(blocked in a system call)", "", KernelCategory::blocked};
  size_t busy = 0;  // samples not blocked in a system call
  for (const ProfileSample& s : prof.samples()) {
    if (s.thread < 0 || static_cast<size_t>(s.thread) >= nthreads) continue;
    const ResolvedSymbol& rs = s.in_syscall ? blocked : sym.resolve(s.pc);
    ++counts[static_cast<size_t>(s.thread)][static_cast<size_t>(rs.category)];
    ++totals[static_cast<size_t>(s.thread)];
    if (!s.in_syscall) {
      ++per_symbol[&rs];
      ++busy;
    }
    ++r.samples;
  }
  r.rows.resize(kNumKernelCategories);
  for (int c = 0; c < kNumKernelCategories; ++c) {
    ProfileReport::Row& row = r.rows[static_cast<size_t>(c)];
    row.category = static_cast<KernelCategory>(c);
    for (size_t t = 0; t < nthreads; ++t) {
      if (totals[t] == 0) continue;
      const double ms = r.step_ms * static_cast<double>(counts[t][static_cast<size_t>(c)]) /
                        static_cast<double>(totals[t]);
      (t == 0 ? row.caller_ms : row.workers_ms) += ms;
    }
  }
  // Functions with the same short name (a kernel's several chunk lambdas) count as one.
  std::map<std::pair<std::string, std::string>, std::pair<KernelCategory, size_t>> merged;
  for (const auto& [rs, n] : per_symbol) {
    auto& slot = merged[{short_name(rs->name), rs->where}];
    slot.first = rs->category;
    slot.second += n;
  }
  for (const auto& [key, val] : merged)
    r.hottest.push_back({key.first, key.second, val.first,
                         static_cast<double>(val.second) / static_cast<double>(busy)});
  std::sort(r.hottest.begin(), r.hottest.end(), [](const auto& a, const auto& b) {
    return a.share != b.share ? a.share > b.share : a.name < b.name;
  });
  if (r.hottest.size() > top) r.hottest.resize(top);
  return r;
}

}  // namespace actorpipe::bench
