// Cluster environment: rank, world and coordinator from flags or from the launcher's variables;
// the job secret from ACTORPIPE_JOB_SECRET or a private file.
#include "transport/cluster_env.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace actorpipe {

namespace {

// A launcher's convention: the variables holding the rank and the number of processes.
struct Convention {
  ClusterSource source;
  const char* rank_var;
  const char* size_var;
  // true: one of the two set without the other is an error. false: such names also appear in
  // environments that are no job of that launcher (RANK; SLURM_PROCID in a batch script), and the
  // convention counts only when both are set.
  bool pair_required;
};

// The innermost launcher first: mpirun, mpiexec and torchrun run inside a Slurm allocation and
// leave its variables in place, so Slurm comes last.
constexpr Convention kConventions[] = {
    {ClusterSource::actorpipe_launch, cluster_vars::rank, cluster_vars::world, true},
    {ClusterSource::open_mpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", true},
    {ClusterSource::mpich, "PMI_RANK", "PMI_SIZE", true},
    {ClusterSource::torchrun, "RANK", "WORLD_SIZE", false},
    {ClusterSource::slurm, "SLURM_PROCID", "SLURM_NTASKS", false},
};

constexpr const char* kSlurmNodelists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                           "SLURM_NODELIST"};

constexpr std::size_t kMinSecret = 16;
constexpr std::size_t kMaxSecret = 4096;

std::optional<std::string> get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// How an input shows in messages: "--rank '3'" for a flag, "OMPI_COMM_WORLD_RANK='3'" for a
// variable.
std::string shown(std::string_view name, std::string_view text) {
  if (!name.empty() && name.front() == '-') return fmt::format("{} '{}'", name, text);
  return fmt::format("{}='{}'", name, text);
}

// A decimal integer in [lo, hi]: digits only (no sign, no spaces).
Expected<int> parse_int(std::string_view name, std::string_view text, int lo, int hi,
                        std::string_view meaning) {
  bool digits = !text.empty() && text.size() <= 9;
  for (const char c : text) digits = digits && c >= '0' && c <= '9';
  const long v = digits ? std::strtol(std::string(text).c_str(), nullptr, 10) : -1;
  if (!digits || v < lo || v > hi) {
    return make_error("{} is not allowed: expected {}, an integer from {} to {}", shown(name, text),
                      meaning, lo, hi);
  }
  return static_cast<int>(v);
}

Expected<int> parse_world(std::string_view name, std::string_view text) {
  return parse_int(name, text, 1, kMaxWorld, "the number of processes");
}

Expected<int> parse_rank(std::string_view name, std::string_view text) {
  return parse_int(name, text, 0, kMaxWorld - 1, "a rank");
}

std::string rank_variables() {
  std::string out;
  for (const Convention& c : kConventions) {
    out += out.empty() ? "" : ", ";
    out += c.rank_var;
  }
  return out;
}

// The secret's rules; `what` names where it came from. The value itself is never shown.
Status check_secret(std::string_view what, std::string_view secret) {
  if (secret.size() < kMinSecret || secret.size() > kMaxSecret) {
    return make_error(
        "{} ({} characters) is not allowed: expected {} to {} printable ASCII characters without "
        "spaces (the value is not shown)",
        what, secret.size(), kMinSecret, kMaxSecret);
  }
  for (std::size_t i = 0; i < secret.size(); ++i) {
    const auto c = static_cast<unsigned char>(secret[i]);
    if (c < 0x21 || c > 0x7e) {
      return make_error(
          "{} holds a space or a character that is not printable ASCII at position {}: expected "
          "{} to {} printable ASCII characters without spaces (the value is not shown)",
          what, i, kMinSecret, kMaxSecret);
    }
  }
  return {};
}

Expected<std::string> read_secret_file(const std::string& path) {
  const std::string what = shown(cluster_vars::job_secret_file, path);
  // O_NONBLOCK: a FIFO must not hang the open; it is refused below as not a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return make_error("{}: cannot open the file: {}", what, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return make_error("{}: cannot stat the file: {}", what, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error("{} is not allowed: expected a regular file holding the secret", what);
  }
  if ((st.st_mode & 0077) != 0) {
    ::close(fd);
    return make_error(
        "{} has mode {:04o}, which lets group or others access it: allowed is a file only its "
        "owner can access (mode & 0077 == 0, e.g. chmod 600 '{}')",
        what, st.st_mode & 07777, path);
  }
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return make_error("{}: cannot read the file: {}", what, std::strerror(e));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > 2 * kMaxSecret) break;  // too long either way; check_secret says so
  }
  ::close(fd);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' ||
                           text.back() == '\t')) {
    text.pop_back();
  }
  if (Status s = check_secret(fmt::format("the secret in {}", what), text); !s) return s.error();
  return text;
}

// A bracket's content in a Slurm node list, "01-04,07": its first number as written ("01").
Expected<std::string> first_in_brackets(std::string_view what, std::string_view nodelist,
                                        std::string_view inner) {
  auto bad = [&](std::string_view detail) {
    return make_error(
        "{} is not allowed: {}; expected a Slurm node list such as 'node[01-04,07],gpu5'",
        shown(what, nodelist), detail);
  };
  if (inner.empty()) return bad("'[]' holds no numbers");
  std::string first;
  std::size_t start = 0;
  while (start <= inner.size()) {
    std::size_t end = inner.find(',', start);
    if (end == std::string_view::npos) end = inner.size();
    const std::string_view item = inner.substr(start, end - start);
    const std::size_t dash = item.find('-');
    const std::string_view lo = item.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    auto number = [](std::string_view s) {
      if (s.empty() || s.size() > 18) return false;
      for (const char c : s) {
        if (c < '0' || c > '9') return false;
      }
      return true;
    };
    if (!number(lo) || !number(hi)) {
      return bad(fmt::format("'{}' in brackets is neither a number nor a range lo-hi", item));
    }
    if (std::stoll(std::string(lo)) > std::stoll(std::string(hi))) {
      return bad(fmt::format("the range '{}' runs backwards", item));
    }
    if (first.empty()) first = std::string(lo);
    start = end + 1;
  }
  return first;
}

}  // namespace

const char* to_string(ClusterSource source) {
  switch (source) {
    case ClusterSource::single:
      return "single process";
    case ClusterSource::flags:
      return "--rank/--world";
    case ClusterSource::actorpipe_launch:
      return "actorpipe-launch";
    case ClusterSource::open_mpi:
      return "Open MPI (mpirun)";
    case ClusterSource::mpich:
      return "MPICH/Hydra (mpiexec)";
    case ClusterSource::torchrun:
      return "torchrun";
    case ClusterSource::slurm:
      return "Slurm (srun)";
  }
  return "?";
}

std::string ClusterEnv::coordinator() const {
  return format_host_port(coordinator_host, coordinator_port);
}

std::string ClusterEnv::describe() const {
  if (coordinator_source == CoordinatorSource::none) {
    return fmt::format("rank {} of {} ({})", rank, world, to_string(source));
  }
  return fmt::format("rank {} of {} ({}), coordinator {}", rank, world, to_string(source),
                     coordinator());
}

EnvLookup process_environment() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

EnvLookup environment_from(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string format_host_port(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

Expected<HostPort> parse_host_port(std::string_view what, std::string_view text) {
  auto bad = [&](std::string_view detail) {
    return make_error(
        "{} is not allowed: {}; expected host:port with a port from 1 to 65535 (an IPv6 address "
        "in brackets: [::1]:29400)",
        shown(what, text), detail);
  };
  std::string_view host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("'[' without ']'");
    host = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("no ':port' after ']'");
    port = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("no ':port'");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return bad("an IPv6 address must be written in brackets");
    }
  }
  if (host.empty()) return bad("the host is empty");
  for (const char c : host) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '/' || c == '[' || c == ']' || c == '@') {
      return bad(fmt::format("the host holds '{}'", c));
    }
  }
  bool digits = !port.empty() && port.size() <= 5;
  for (const char c : port) digits = digits && c >= '0' && c <= '9';
  const int p = digits ? std::stoi(std::string(port)) : 0;
  if (p < 1 || p > 65535) return bad(fmt::format("the port '{}' is not from 1 to 65535", port));
  return HostPort{std::string(host), p};
}

Expected<std::string> slurm_first_host(std::string_view what, std::string_view nodelist) {
  auto bad = [&](std::string_view detail) {
    return make_error(
        "{} is not allowed: {}; expected a Slurm node list such as 'node[01-04,07],gpu5'",
        shown(what, nodelist), detail);
  };
  std::string host;
  std::size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    const char c = nodelist[i];
    if (c == '[') {
      const std::size_t close = nodelist.find(']', i);
      if (close == std::string_view::npos) return bad("'[' without ']'");
      const std::string_view inner = nodelist.substr(i + 1, close - i - 1);
      if (inner.find('[') != std::string_view::npos) return bad("brackets inside brackets");
      auto first = first_in_brackets(what, nodelist, inner);
      if (!first) return first.error();
      host += *first;
      i = close + 1;
    } else if (c == ']') {
      return bad("']' without '['");
    } else if (static_cast<unsigned char>(c) <= ' ') {
      return bad("it holds white space or a control character");
    } else {
      host += c;
      ++i;
    }
  }
  if (host.empty()) return bad("the first host is empty");
  return host;
}

Expected<ClusterEnv> resolve_cluster_env(const ClusterFlags& flags, const EnvLookup& env,
                                         const ClusterDefaults& defaults) {
  ClusterEnv out;

  // The secret's source.
  const auto secret = get(env, cluster_vars::job_secret);
  const auto secret_file = get(env, cluster_vars::job_secret_file);
  if (secret && secret_file) {
    return make_error(
        "{} and {} are both set: set only one of them (the secret itself, or a file holding it)",
        cluster_vars::job_secret, cluster_vars::job_secret_file);
  }
  if (secret) out.secret.kind = JobSecretSource::Kind::variable;
  if (secret_file) out.secret = {JobSecretSource::Kind::file, *secret_file};

  // The flags, checked whatever else is set.
  std::optional<int> flag_rank;
  std::optional<int> flag_world;
  if (flags.world) {
    auto w = parse_world("--world", *flags.world);
    if (!w) return w.error();
    flag_world = *w;
  }
  if (flags.rank) {
    auto r = parse_rank("--rank", *flags.rank);
    if (!r) return r.error();
    flag_rank = *r;
  }

  // The first launcher whose variables are set.
  const Convention* launcher = nullptr;
  std::string rank_text;
  std::string size_text;
  for (const Convention& c : kConventions) {
    const auto r = get(env, c.rank_var);
    const auto s = get(env, c.size_var);
    if (r && s) {
      launcher = &c;
      rank_text = *r;
      size_text = *s;
      break;
    }
    if ((r || s) && c.pair_required) {
      const char* set = r ? c.rank_var : c.size_var;
      const char* unset = r ? c.size_var : c.rank_var;
      return make_error("{} is set but {} is not: {} sets both; set both or neither",
                        shown(set, r ? *r : *s), unset, to_string(c.source));
    }
  }

  std::string rank_shown;
  std::string world_shown;
  if (launcher != nullptr) {
    auto w = parse_world(launcher->size_var, size_text);
    if (!w) return w.error();
    auto r = parse_rank(launcher->rank_var, rank_text);
    if (!r) return r.error();
    out.world = *w;
    out.rank = *r;
    out.source = launcher->source;
    rank_shown = shown(launcher->rank_var, rank_text);
    world_shown = shown(launcher->size_var, size_text);
    if (flag_world && *flag_world != out.world) {
      return make_error(
          "--world {} disagrees with {} set by {}: give no --world under a launcher, or the same "
          "value",
          *flag_world, world_shown, to_string(out.source));
    }
    if (flag_rank && *flag_rank != out.rank) {
      return make_error(
          "--rank {} disagrees with {} set by {}: give no --rank under a launcher, or the same "
          "value",
          *flag_rank, rank_shown, to_string(out.source));
    }
  } else if (flag_world) {
    out.world = *flag_world;
    out.source = ClusterSource::flags;
    world_shown = shown("--world", *flags.world);
    if (flag_rank) {
      out.rank = *flag_rank;
      rank_shown = shown("--rank", *flags.rank);
    } else if (out.world > 1) {
      return make_error(
          "--world {} needs --rank: no launcher's variables are set (looked for {}), so only "
          "--rank can say which process this is",
          out.world, rank_variables());
    }
  } else if (flag_rank) {
    return make_error(
        "--rank {} needs --world: no launcher's variables are set (looked for {}), so only "
        "--world can say how many processes there are",
        *flag_rank, rank_variables());
  }
  if (out.rank >= out.world) {
    return make_error("{} is not allowed with {}: expected a rank from 0 to {}", rank_shown,
                      world_shown, out.world - 1);
  }

  // The coordinator.
  auto take = [&](std::string_view what, const std::string& text,
                  CoordinatorSource source) -> Status {
    auto hp = parse_host_port(what, text);
    if (!hp) return hp.error();
    out.coordinator_host = hp->host;
    out.coordinator_port = hp->port;
    out.coordinator_source = source;
    return {};
  };
  if (flags.coordinator) {
    if (Status s = take("--coordinator", *flags.coordinator, CoordinatorSource::flag); !s) {
      return s.error();
    }
    return out;
  }
  if (const auto c = get(env, cluster_vars::coordinator)) {
    if (Status s = take(cluster_vars::coordinator, *c, CoordinatorSource::variable); !s) {
      return s.error();
    }
    return out;
  }
  if (!out.multi_process()) return out;  // one process needs no coordinator

  if (out.source == ClusterSource::torchrun) {
    const auto addr = get(env, "MASTER_ADDR");
    const auto port = get(env, "MASTER_PORT");
    if (addr && port) {
      auto p = parse_int("MASTER_PORT", *port, 1, 65535, "a TCP port");
      if (!p) return p.error();
      // With TORCHELASTIC_USE_AGENT_STORE=True torchrun's own store already listens on
      // MASTER_PORT; the coordinator takes the port above it.
      const auto agent_store = get(env, "TORCHELASTIC_USE_AGENT_STORE");
      const bool shifted = agent_store && *agent_store == "True";
      if (shifted && *p == 65535) {
        return make_error(
            "MASTER_PORT='65535' with TORCHELASTIC_USE_AGENT_STORE='True' leaves no port for the "
            "coordinator (it takes MASTER_PORT + 1): set {}=host:port",
            cluster_vars::coordinator);
      }
      out.coordinator_host = *addr;
      out.coordinator_port = *p + (shifted ? 1 : 0);
      out.coordinator_source = CoordinatorSource::torchrun;
      return out;
    }
    if (addr || port) {
      return make_error("{} is set but {} is not: torchrun sets both; set both or neither",
                        addr ? shown("MASTER_ADDR", *addr) : shown("MASTER_PORT", *port),
                        addr ? "MASTER_PORT" : "MASTER_ADDR");
    }
  }
  if (out.source == ClusterSource::slurm) {
    for (const char* name : kSlurmNodelists) {
      const auto list = get(env, name);
      if (!list) continue;
      auto host = slurm_first_host(name, *list);
      if (!host) return host.error();
      if (defaults.port == 0) {
        return make_error(
            "rank {} of {} (Slurm): {} names the coordinator's host '{}' but nothing names its "
            "port (no default port is configured): set {}={}:PORT or pass --coordinator {}:PORT",
            out.rank, out.world, shown(name, *list), *host, cluster_vars::coordinator, *host,
            *host);
      }
      out.coordinator_host = *host;
      out.coordinator_port = defaults.port;
      out.coordinator_source = CoordinatorSource::slurm;
      return out;
    }
  }
  if (out.rank == 0 && defaults.port != 0) {
    out.coordinator_host = defaults.host;
    out.coordinator_port = defaults.port;
    out.coordinator_source = CoordinatorSource::defaults;
    return out;
  }
  return make_error(
      "rank {} of {} ({}: {}, {}) has no coordinator address{}: set {}=host:port in every rank's "
      "environment, or pass --coordinator host:port",
      out.rank, out.world, to_string(out.source), rank_shown, world_shown,
      out.rank == 0 ? " and no default port is configured" : "", cluster_vars::coordinator);
}

Expected<std::string> load_job_secret(const ClusterEnv& cluster, const EnvLookup& env) {
  switch (cluster.secret.kind) {
    case JobSecretSource::Kind::none:
      if (!cluster.multi_process()) return std::string();
      return make_error(
          "a job of {} processes needs a job secret and none is set: set {}, or {} naming a file "
          "only its owner can access (actorpipe-launch sets {} itself)",
          cluster.world, cluster_vars::job_secret, cluster_vars::job_secret_file,
          cluster_vars::job_secret);
    case JobSecretSource::Kind::variable: {
      const auto secret = get(env, cluster_vars::job_secret);
      if (!secret) {
        return make_error("{} is no longer set: expected the secret the job was started with",
                          cluster_vars::job_secret);
      }
      if (Status s = check_secret(cluster_vars::job_secret, *secret); !s) return s.error();
      return *secret;
    }
    case JobSecretSource::Kind::file:
      return read_secret_file(cluster.secret.path);
  }
  return make_error("unknown job secret source");
}

}  // namespace actorpipe
