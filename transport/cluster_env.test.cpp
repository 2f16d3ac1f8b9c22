// Tests of the cluster environment: every launcher's convention, the precedence between flags and
// launchers, the coordinator's sources, Slurm node lists, the job secret's rules and every error.
#include "transport/cluster_env.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "tests/support/temp_dir.hpp"

using namespace actorpipe;

namespace {

using Vars = std::map<std::string, std::string>;

Expected<ClusterEnv> resolve(const Vars& vars, const ClusterFlags& flags = {},
                             const ClusterDefaults& defaults = {}) {
  return resolve_cluster_env(flags, environment_from(vars), defaults);
}

// The error message of a result that must have failed.
template <class T>
std::string error_of(const Expected<T>& e) {
  REQUIRE_FALSE(e.ok());
  return e.error().message;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A file holding `content` with `mode`, in a fresh temporary folder removed with it.
struct TempFile {
  testing::TempDir dir;
  std::string path = dir.file("secret");
  TempFile(const std::string& content, mode_t mode) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
    ::close(fd);
    REQUIRE(::chmod(path.c_str(), mode) == 0);
  }
};

const std::string kSecret(64, 'a');

}  // namespace

TEST_CASE("no launcher variables and no flags: one process, rank 0 of 1") {
  auto c = resolve({{"HOME", "/root"}, {"PATH", "/bin"}});
  REQUIRE(c.ok());
  CHECK(c->rank == 0);
  CHECK(c->world == 1);
  CHECK_FALSE(c->multi_process());
  CHECK(c->source == ClusterSource::single);
  CHECK(c->coordinator_source == CoordinatorSource::none);
  CHECK(c->secret.kind == JobSecretSource::Kind::none);
  CHECK(c->describe() == "rank 0 of 1 (single process)");
}

TEST_CASE("flags alone give rank, world and coordinator") {
  auto c = resolve({}, {"2", "4", "node7:29400"});
  REQUIRE(c.ok());
  CHECK(c->rank == 2);
  CHECK(c->world == 4);
  CHECK(c->source == ClusterSource::flags);
  CHECK(c->coordinator_host == "node7");
  CHECK(c->coordinator_port == 29400);
  CHECK(c->coordinator_source == CoordinatorSource::flag);
  CHECK(c->describe() == "rank 2 of 4 (--rank/--world), coordinator node7:29400");
}

TEST_CASE(
    "the flags alone: world 1 is one process, a larger world needs a rank, a rank needs a world") {
  ClusterFlags one;
  one.world = "1";
  auto c = resolve({}, one);
  REQUIRE(c.ok());
  CHECK(c->rank == 0);
  CHECK(c->world == 1);
  CHECK(c->source == ClusterSource::flags);

  ClusterFlags four;
  four.world = "4";
  const std::string e1 = error_of(resolve({}, four));
  CHECK(contains(e1, "--world 4 needs --rank"));
  CHECK(contains(e1, "ACTORPIPE_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, RANK, SLURM_PROCID"));

  ClusterFlags rank;
  rank.rank = "2";
  CHECK(contains(error_of(resolve({}, rank)), "--rank 2 needs --world"));
}

TEST_CASE("actorpipe-launch's variables") {
  auto c = resolve({{"ACTORPIPE_RANK", "1"},
                    {"ACTORPIPE_WORLD", "3"},
                    {"ACTORPIPE_COORDINATOR", "127.0.0.1:40111"},
                    {"ACTORPIPE_JOB_SECRET", kSecret}});
  REQUIRE(c.ok());
  CHECK(c->rank == 1);
  CHECK(c->world == 3);
  CHECK(c->source == ClusterSource::actorpipe_launch);
  CHECK(c->coordinator() == "127.0.0.1:40111");
  CHECK(c->coordinator_source == CoordinatorSource::variable);
  CHECK(c->secret.kind == JobSecretSource::Kind::variable);
  CHECK(c->describe() == "rank 1 of 3 (actorpipe-launch), coordinator 127.0.0.1:40111");
}

TEST_CASE("Open MPI's mpirun: OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE") {
  auto c = resolve({{"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                    {"ACTORPIPE_COORDINATOR", "head:29400"}});
  REQUIRE(c.ok());
  CHECK(c->rank == 3);
  CHECK(c->world == 4);
  CHECK(c->source == ClusterSource::open_mpi);
  CHECK(c->coordinator() == "head:29400");
}

TEST_CASE("MPICH/Hydra's mpiexec: PMI_RANK and PMI_SIZE") {
  auto c = resolve({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, {}, {"127.0.0.1", 29400});
  REQUIRE(c.ok());
  CHECK(c->rank == 0);
  CHECK(c->world == 2);
  CHECK(c->source == ClusterSource::mpich);
  CHECK(c->coordinator_source == CoordinatorSource::defaults);
  CHECK(c->coordinator() == "127.0.0.1:29400");
}

TEST_CASE("torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT") {
  const Vars base = {{"RANK", "5"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_RANK", "1"},
                     {"MASTER_ADDR", "10.0.0.2"},
                     {"MASTER_PORT", "29500"}};
  auto c = resolve(base);
  REQUIRE(c.ok());
  CHECK(c->rank == 5);
  CHECK(c->world == 8);
  CHECK(c->source == ClusterSource::torchrun);
  CHECK(c->coordinator_source == CoordinatorSource::torchrun);
  CHECK(c->coordinator() == "10.0.0.2:29500");

  SUBCASE("torchrun's own store holds MASTER_PORT: the coordinator takes the port above") {
    Vars v = base;
    v["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    auto s = resolve(v);
    REQUIRE(s.ok());
    CHECK(s->coordinator() == "10.0.0.2:29501");
    v["MASTER_PORT"] = "65535";
    const std::string e = error_of(resolve(v));
    CHECK(contains(e, "MASTER_PORT='65535'"));
    CHECK(contains(e, "ACTORPIPE_COORDINATOR=host:port"));
  }
  SUBCASE("MASTER_ADDR without MASTER_PORT") {
    Vars v = base;
    v.erase("MASTER_PORT");
    const std::string e = error_of(resolve(v));
    CHECK(contains(e, "MASTER_ADDR='10.0.0.2' is set but MASTER_PORT is not"));
    v["MASTER_PORT"] = "29500";
    v.erase("MASTER_ADDR");
    CHECK(contains(error_of(resolve(v)), "MASTER_PORT='29500' is set but MASTER_ADDR is not"));
  }
  SUBCASE("a bad MASTER_PORT") {
    Vars v = base;
    v["MASTER_PORT"] = "http";
    const std::string e = error_of(resolve(v));
    CHECK(contains(e,
                   "MASTER_PORT='http' is not allowed: expected a TCP port, an integer from "
                   "1 to 65535"));
  }
  SUBCASE("ACTORPIPE_COORDINATOR wins over MASTER_ADDR") {
    Vars v = base;
    v["ACTORPIPE_COORDINATOR"] = "10.0.0.9:7000";
    auto s = resolve(v);
    REQUIRE(s.ok());
    CHECK(s->coordinator() == "10.0.0.9:7000");
    CHECK(s->coordinator_source == CoordinatorSource::variable);
  }
}

TEST_CASE("Slurm's srun: SLURM_PROCID, SLURM_NTASKS, the coordinator host from the node list") {
  const Vars base = {
      {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "gpu[07-10],cpu1"}};
  const ClusterDefaults port{"127.0.0.1", 29400};
  auto c = resolve(base, {}, port);
  REQUIRE(c.ok());
  CHECK(c->rank == 2);
  CHECK(c->world == 4);
  CHECK(c->source == ClusterSource::slurm);
  CHECK(c->coordinator_source == CoordinatorSource::slurm);
  CHECK(c->coordinator() == "gpu07:29400");

  SUBCASE("the step's node list comes first, then the job's, then SLURM_NODELIST") {
    Vars v = base;
    v["SLURM_STEP_NODELIST"] = "gpu[09-10]";
    v["SLURM_NODELIST"] = "other1";
    CHECK(resolve(v, {}, port)->coordinator_host == "gpu09");
    v.erase("SLURM_STEP_NODELIST");
    CHECK(resolve(v, {}, port)->coordinator_host == "gpu07");
    v.erase("SLURM_JOB_NODELIST");
    CHECK(resolve(v, {}, port)->coordinator_host == "other1");
  }
  SUBCASE("Slurm names no port: without a default port every rank is told to set one") {
    const std::string e = error_of(resolve(base));
    CHECK(contains(e,
                   "SLURM_JOB_NODELIST='gpu[07-10],cpu1' names the coordinator's host "
                   "'gpu07' but nothing names its port"));
    CHECK(contains(e, "ACTORPIPE_COORDINATOR=gpu07:PORT"));
  }
  SUBCASE("an explicit setting wins over the node list") {
    Vars v = base;
    v["ACTORPIPE_COORDINATOR"] = "login1:5000";
    CHECK(resolve(v)->coordinator() == "login1:5000");
    ClusterFlags f;
    f.coordinator = "login2:5001";
    CHECK(resolve(v, f)->coordinator() == "login2:5001");
  }
  SUBCASE("no node list: rank 1 has no coordinator") {
    Vars v = base;
    v.erase("SLURM_JOB_NODELIST");
    v["SLURM_PROCID"] = "1";
    CHECK(contains(error_of(resolve(v, {}, port)),
                   "rank 1 of 4 (Slurm (srun): SLURM_PROCID='1', SLURM_NTASKS='4') has no "
                   "coordinator address"));
  }
  SUBCASE("a broken node list is named") {
    Vars v = base;
    v["SLURM_JOB_NODELIST"] = "gpu[07-10";
    CHECK(contains(error_of(resolve(v, {}, port)),
                   "SLURM_JOB_NODELIST='gpu[07-10' is not allowed: '[' without ']'"));
  }
}

TEST_CASE("precedence: flags, then actorpipe-launch, Open MPI, MPICH, torchrun, Slurm") {
  Vars v = {{"ACTORPIPE_RANK", "0"},
            {"ACTORPIPE_WORLD", "2"},
            {"OMPI_COMM_WORLD_RANK", "1"},
            {"OMPI_COMM_WORLD_SIZE", "3"},
            {"PMI_RANK", "2"},
            {"PMI_SIZE", "4"},
            {"RANK", "3"},
            {"WORLD_SIZE", "5"},
            {"SLURM_PROCID", "4"},
            {"SLURM_NTASKS", "6"},
            {"ACTORPIPE_COORDINATOR", "h:1"}};
  CHECK(resolve(v)->source == ClusterSource::actorpipe_launch);
  CHECK(resolve(v)->world == 2);
  v.erase("ACTORPIPE_RANK");
  v.erase("ACTORPIPE_WORLD");
  CHECK(resolve(v)->source == ClusterSource::open_mpi);
  CHECK(resolve(v)->world == 3);
  v.erase("OMPI_COMM_WORLD_RANK");
  v.erase("OMPI_COMM_WORLD_SIZE");
  CHECK(resolve(v)->source == ClusterSource::mpich);
  CHECK(resolve(v)->world == 4);
  v.erase("PMI_RANK");
  v.erase("PMI_SIZE");
  CHECK(resolve(v)->source == ClusterSource::torchrun);
  CHECK(resolve(v)->world == 5);
  v.erase("RANK");
  v.erase("WORLD_SIZE");
  CHECK(resolve(v)->source == ClusterSource::slurm);
  CHECK(resolve(v)->rank == 4);
  CHECK(resolve(v)->world == 6);
}

TEST_CASE("flags that agree with the launcher are accepted, disagreeing flags are errors") {
  const Vars v = {{"OMPI_COMM_WORLD_RANK", "1"},
                  {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"ACTORPIPE_COORDINATOR", "h:1"}};
  auto ok = resolve(v, {"1", "4", std::nullopt});
  REQUIRE(ok.ok());
  CHECK(ok->source == ClusterSource::open_mpi);

  ClusterFlags rank;
  rank.rank = "0";
  const std::string e1 = error_of(resolve(v, rank));
  CHECK(contains(e1,
                 "--rank 0 disagrees with OMPI_COMM_WORLD_RANK='1' set by Open MPI "
                 "(mpirun)"));
  ClusterFlags world;
  world.world = "2";
  const std::string e2 = error_of(resolve(v, world));
  CHECK(contains(e2, "--world 2 disagrees with OMPI_COMM_WORLD_SIZE='4' set by Open MPI"));
}

TEST_CASE("one variable of a pair alone: an error for actorpipe-launch, mpirun and mpiexec") {
  CHECK(contains(error_of(resolve({{"ACTORPIPE_RANK", "1"}})),
                 "ACTORPIPE_RANK='1' is set but ACTORPIPE_WORLD is not: actorpipe-launch sets "
                 "both"));
  CHECK(contains(error_of(resolve({{"OMPI_COMM_WORLD_SIZE", "4"}})),
                 "OMPI_COMM_WORLD_SIZE='4' is set but OMPI_COMM_WORLD_RANK is not"));
  CHECK(
      contains(error_of(resolve({{"PMI_RANK", "0"}})), "PMI_RANK='0' is set but PMI_SIZE is not"));
  // RANK alone (any program may set it) and SLURM_PROCID alone (a batch script) are no job
  auto lone = resolve({{"RANK", "3"}, {"SLURM_PROCID", "0"}});
  REQUIRE(lone.ok());
  CHECK(lone->source == ClusterSource::single);
  CHECK(lone->world == 1);
}

TEST_CASE("a rank outside 0..world-1 is an error naming both values") {
  CHECK(contains(error_of(resolve({{"PMI_RANK", "4"}, {"PMI_SIZE", "4"}})),
                 "PMI_RANK='4' is not allowed with PMI_SIZE='4': expected a rank from 0 to 3"));
  CHECK(contains(error_of(resolve({}, {"2", "2", std::nullopt})),
                 "--rank '2' is not allowed with --world '2': expected a rank from 0 to 1"));
}

TEST_CASE("values that are not plain decimal integers are errors") {
  for (const char* bad : {"x", "-1", "+1", " 1", "1 ", "1.0", "0x2", "99999999999"}) {
    CAPTURE(std::string(bad));
    const std::string e = error_of(resolve({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", bad}}));
    CHECK(contains(e, std::string("SLURM_NTASKS='") + bad +
                          "' is not allowed: expected the "
                          "number of processes, an integer from 1 to 1000000"));
  }
  CHECK(contains(error_of(resolve({{"RANK", "one"}, {"WORLD_SIZE", "2"}})),
                 "RANK='one' is not allowed: expected a rank, an integer from 0 to 999999"));
  CHECK(contains(error_of(resolve({{"ACTORPIPE_RANK", "0"}, {"ACTORPIPE_WORLD", "0"}})),
                 "ACTORPIPE_WORLD='0' is not allowed"));
  CHECK(contains(error_of(resolve({}, {"a", "2", std::nullopt})),
                 "--rank 'a' is not allowed: expected a rank"));
  CHECK(contains(error_of(resolve({}, {"0", "many", std::nullopt})),
                 "--world 'many' is not allowed: expected the number of processes"));
  // the flags are checked even under a launcher
  CHECK(contains(error_of(resolve({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}},
                                  {"zero", std::nullopt, std::nullopt})),
                 "--rank 'zero' is not allowed"));
}

TEST_CASE("empty variables count as unset") {
  auto c = resolve({{"ACTORPIPE_RANK", ""},
                    {"ACTORPIPE_WORLD", ""},
                    {"OMPI_COMM_WORLD_RANK", "1"},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"ACTORPIPE_COORDINATOR", ""},
                    {"ACTORPIPE_JOB_SECRET", ""}},
                   {}, {"127.0.0.1", 0});
  // rank 1 has no coordinator: the empty ACTORPIPE_COORDINATOR does not count
  CHECK(contains(error_of(c), "has no coordinator address"));
}

TEST_CASE("a multi-process job needs a coordinator address, rank 0 may use the default") {
  const Vars mpi1 = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  const Vars mpi0 = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  const ClusterDefaults with_port{"127.0.0.1", 29400};

  const std::string e1 = error_of(resolve(mpi1, {}, with_port));
  CHECK(contains(e1,
                 "rank 1 of 2 (Open MPI (mpirun): OMPI_COMM_WORLD_RANK='1', "
                 "OMPI_COMM_WORLD_SIZE='2') has no coordinator address: set "
                 "ACTORPIPE_COORDINATOR=host:port"));
  auto r0 = resolve(mpi0, {}, with_port);
  REQUIRE(r0.ok());
  CHECK(r0->coordinator() == "127.0.0.1:29400");
  CHECK(r0->coordinator_source == CoordinatorSource::defaults);

  // port 0: no default port; rank 0 must be told too
  const std::string e0 = error_of(resolve(mpi0));
  CHECK(contains(e0, "rank 0 of 2"));
  CHECK(contains(e0, "has no coordinator address and no default port is configured"));

  // flags alone, world 2: the same rule
  CHECK(contains(error_of(resolve({}, {"1", "2", std::nullopt}, with_port)),
                 "rank 1 of 2 (--rank/--world: --rank '1', --world '2') has no coordinator"));
}

TEST_CASE("the coordinator flag overrides ACTORPIPE_COORDINATOR, both are checked") {
  const Vars v = {{"ACTORPIPE_RANK", "1"},
                  {"ACTORPIPE_WORLD", "2"},
                  {"ACTORPIPE_COORDINATOR", "127.0.0.1:4000"}};
  ClusterFlags f;
  f.coordinator = "[::1]:4001";
  auto c = resolve(v, f);
  REQUIRE(c.ok());
  CHECK(c->coordinator_host == "::1");
  CHECK(c->coordinator_port == 4001);
  CHECK(c->coordinator() == "[::1]:4001");
  CHECK(c->coordinator_source == CoordinatorSource::flag);

  Vars bad = v;
  bad["ACTORPIPE_COORDINATOR"] = "127.0.0.1";
  CHECK(contains(error_of(resolve(bad)),
                 "ACTORPIPE_COORDINATOR='127.0.0.1' is not allowed: no ':port'"));
  f.coordinator = "host:0";
  CHECK(contains(error_of(resolve(v, f)),
                 "--coordinator 'host:0' is not allowed: the port '0' is not from 1 to 65535"));
  // a bad address is an error even in a single-process job
  f.coordinator = "nohost";
  CHECK_FALSE(resolve({}, f).ok());
}

TEST_CASE("host:port parsing") {
  auto a = parse_host_port("--coordinator", "node-1.example.org:65535");
  REQUIRE(a.ok());
  CHECK(a->host == "node-1.example.org");
  CHECK(a->port == 65535);
  auto b = parse_host_port("X", "[fe80::1%eth0]:1");
  REQUIRE(b.ok());
  CHECK(b->host == "fe80::1%eth0");
  CHECK(b->port == 1);
  CHECK(format_host_port("fe80::1", 2) == "[fe80::1]:2");
  CHECK(format_host_port("h", 2) == "h:2");

  const char* bad[][2] = {
      {"::1:80", "an IPv6 address must be written in brackets"},
      {":80", "the host is empty"},
      {"h:", "the port '' is not from 1 to 65535"},
      {"h:65536", "the port '65536' is not from 1 to 65535"},
      {"h:8o", "the port '8o' is not from 1 to 65535"},
      {"[::1]80", "no ':port' after ']'"},
      {"[::1:80", "'[' without ']'"},
      {"a b:80", "the host holds ' '"},
  };
  for (const auto& [text, detail] : bad) {
    CAPTURE(std::string(text));
    const std::string e = error_of(parse_host_port("X", text));
    CHECK(contains(e, std::string("X='") + text + "' is not allowed: " + detail));
    CHECK(contains(e, "expected host:port with a port from 1 to 65535"));
  }
}

TEST_CASE("Slurm node lists: the first host of the compressed forms") {
  const char* cases[][2] = {
      {"gpu5", "gpu5"},
      {"node[01-04,07],gpu5", "node01"},
      {"node[07,01-04]", "node07"},
      {"node[3]", "node3"},
      {"a,b,c", "a"},
      {"rack[2-3]-n[5,9]", "rack2-n5"},
      {"n[001-100]x,m1", "n001x"},
      {"host.example.org", "host.example.org"},
  };
  for (const auto& [list, first] : cases) {
    CAPTURE(std::string(list));
    auto h = slurm_first_host("SLURM_NODELIST", list);
    REQUIRE(h.ok());
    CHECK(*h == first);
  }
  const char* bad[][2] = {
      {"", "the first host is empty"},
      {",a", "the first host is empty"},
      {"n[1-3", "'[' without ']'"},
      {"n1]", "']' without '['"},
      {"n[]", "'[]' holds no numbers"},
      {"n[a-b]", "'a-b' in brackets is neither a number nor a range lo-hi"},
      {"n[1-2-3]", "'1-2-3' in brackets is neither a number nor a range lo-hi"},
      {"n[1,]", "'' in brackets is neither a number nor a range lo-hi"},
      {"n[5-3]", "the range '5-3' runs backwards"},
      {"n[[1]]", "brackets inside brackets"},
      {"n 1", "it holds white space"},
  };
  for (const auto& [list, detail] : bad) {
    CAPTURE(std::string(list));
    const std::string e = error_of(slurm_first_host("SLURM_NODELIST", list));
    CHECK(contains(e, std::string("SLURM_NODELIST='") + list + "' is not allowed: " + detail));
    CHECK(contains(e, "expected a Slurm node list such as 'node[01-04,07],gpu5'"));
  }
}

TEST_CASE("the job secret from ACTORPIPE_JOB_SECRET") {
  const Vars v = {{"ACTORPIPE_RANK", "0"},
                  {"ACTORPIPE_WORLD", "2"},
                  {"ACTORPIPE_COORDINATOR", "127.0.0.1:4000"},
                  {"ACTORPIPE_JOB_SECRET", kSecret}};
  auto c = resolve(v);
  REQUIRE(c.ok());
  auto s = load_job_secret(*c, environment_from(v));
  REQUIRE(s.ok());
  CHECK(*s == kSecret);

  Vars short_secret = v;
  short_secret["ACTORPIPE_JOB_SECRET"] = "hunter2";
  const std::string e1 = error_of(load_job_secret(*c, environment_from(short_secret)));
  CHECK(contains(e1,
                 "ACTORPIPE_JOB_SECRET (7 characters) is not allowed: expected 16 to 4096 "
                 "printable ASCII characters without spaces (the value is not shown)"));
  CHECK_FALSE(contains(e1, "hunter2"));

  Vars spaced = v;
  spaced["ACTORPIPE_JOB_SECRET"] = "correct horse battery staple";
  const std::string e2 = error_of(load_job_secret(*c, environment_from(spaced)));
  CHECK(contains(e2, "at position 7"));
  CHECK_FALSE(contains(e2, "horse"));

  Vars gone = v;
  gone.erase("ACTORPIPE_JOB_SECRET");
  CHECK(contains(error_of(load_job_secret(*c, environment_from(gone))),
                 "ACTORPIPE_JOB_SECRET is no longer set"));
}

TEST_CASE("the job secret from a file only its owner can access") {
  TempFile file(kSecret + "\n", 0600);
  const Vars v = {{"ACTORPIPE_RANK", "1"},
                  {"ACTORPIPE_WORLD", "2"},
                  {"ACTORPIPE_COORDINATOR", "127.0.0.1:4000"},
                  {"ACTORPIPE_JOB_SECRET_FILE", file.path}};
  auto c = resolve(v);
  REQUIRE(c.ok());
  CHECK(c->secret.kind == JobSecretSource::Kind::file);
  CHECK(c->secret.path == file.path);
  auto s = load_job_secret(*c, environment_from(v));
  REQUIRE(s.ok());
  CHECK(*s == kSecret);  // the trailing newline is dropped

  SUBCASE("readable by group or others: refused, naming the mode") {
    for (const mode_t mode : {0644, 0640, 0604, 0601, 0610}) {
      CAPTURE(mode);
      REQUIRE(::chmod(file.path.c_str(), mode) == 0);
      const std::string e = error_of(load_job_secret(*c, environment_from(v)));
      CHECK(contains(e, fmt::format("ACTORPIPE_JOB_SECRET_FILE='{}' has mode {:04o}, which lets "
                                    "group or others access it",
                                    file.path, mode)));
      CHECK(contains(e, "mode & 0077 == 0"));
      CHECK_FALSE(contains(e, kSecret));
    }
    REQUIRE(::chmod(file.path.c_str(), 0400) == 0);
    CHECK(load_job_secret(*c, environment_from(v)).ok());
  }
  SUBCASE("a missing file, a folder, a short secret") {
    ClusterEnv missing = *c;
    missing.secret.path = file.dir.file("none");
    CHECK(contains(error_of(load_job_secret(missing, environment_from(v))),
                   "cannot open the file: No such file or directory"));
    ClusterEnv folder = *c;
    folder.secret.path = file.dir.str();
    REQUIRE(::chmod(file.dir.str().c_str(), 0700) == 0);
    CHECK(contains(error_of(load_job_secret(folder, environment_from(v))),
                   "is not allowed: expected a regular file holding the secret"));
    TempFile short_file("abc\n", 0600);
    ClusterEnv shorter = *c;
    shorter.secret.path = short_file.path;
    const std::string e = error_of(load_job_secret(shorter, environment_from(v)));
    CHECK(contains(e, "the secret in ACTORPIPE_JOB_SECRET_FILE='" + short_file.path +
                          "' (3 characters) is not allowed"));
  }
}

TEST_CASE("the secret: both sources set is an error, a multi-process job needs one") {
  CHECK(contains(
      error_of(resolve({{"ACTORPIPE_JOB_SECRET", kSecret}, {"ACTORPIPE_JOB_SECRET_FILE", "/x"}})),
      "ACTORPIPE_JOB_SECRET and ACTORPIPE_JOB_SECRET_FILE are both set: set only "
      "one of them"));
  auto single = resolve({});
  REQUIRE(single.ok());
  auto none = load_job_secret(*single, environment_from({}));
  REQUIRE(none.ok());
  CHECK(none->empty());

  const Vars v = {{"PMI_RANK", "0"}, {"PMI_SIZE", "3"}, {"ACTORPIPE_COORDINATOR", "h:9"}};
  auto multi = resolve(v);
  REQUIRE(multi.ok());
  CHECK(contains(error_of(load_job_secret(*multi, environment_from(v))),
                 "a job of 3 processes needs a job secret and none is set: set "
                 "ACTORPIPE_JOB_SECRET, or ACTORPIPE_JOB_SECRET_FILE"));
}

TEST_CASE("process_environment reads the real environment") {
  ::setenv("ACTORPIPE_CLUSTER_ENV_TEST", "42", 1);
  const EnvLookup env = process_environment();
  REQUIRE(env("ACTORPIPE_CLUSTER_ENV_TEST") != nullptr);
  CHECK(std::string(env("ACTORPIPE_CLUSTER_ENV_TEST")) == "42");
  ::unsetenv("ACTORPIPE_CLUSTER_ENV_TEST");
  CHECK(env("ACTORPIPE_CLUSTER_ENV_TEST") == nullptr);
}
