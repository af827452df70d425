// The cluster subcommands of `pipetrain`:
//   up       start a coordinator and N workers here, train, show progress
//   submit   send a job spec (JSON or YAML) to a coordinator
//   jobs     list jobs;   job ID   one job as JSON;   cancel ID
//   drain    take a worker out of service
//   workers  list workers
// The commands that call a coordinator take --coordinator, --tls-ca (or
// $PIPETRAIN_COORDINATOR, $PIPETRAIN_CA), --token-file (or $PIPETRAIN_TOKEN)
// and --timeout (each call's deadline); the listings (jobs, workers, job)
// print JSON with --json. Each Run returns the process exit code of
// cli/exit_codes.h: 0 ok, 2 bad command line, 64 + the status code of a
// failed call, 1 a job that ended other than SUCCEEDED, 130 interrupted.
#ifndef PIPETRAIN_CLI_CLUSTER_COMMANDS_H_
#define PIPETRAIN_CLI_CLUSTER_COMMANDS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/flag_set.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

int RunUp(const std::vector<std::string>& args);
int RunSubmit(const std::vector<std::string>& args);
int RunJobs(const std::vector<std::string>& args);
int RunJob(const std::vector<std::string>& args);
int RunCancel(const std::vector<std::string>& args);
int RunDrain(const std::vector<std::string>& args);
int RunWorkers(const std::vector<std::string>& args);

// `up --worker-device` against this machine, checked before anything
// starts (the workers run here, and would refuse it only once started):
// cuda and cuda:N need a binary built with CUDA (`built_with_cuda`) and
// device N among the `visible_gpus`. FAILED_PRECONDITION naming
// --worker-device otherwise. Any other value passes (auto, cpu and
// cuda:each are checked elsewhere, the syntax by ValidateDeviceFlags).
absl::Status CheckWorkerDeviceHere(const std::string& device, bool built_with_cuda,
                                   int visible_gpus);

// The --memory-limit `up` gives each of its `workers` CPU workers, all in
// its own cgroup, whose limit is `cgroup_limit` (CgroupMemoryLimit; 0:
// none) on a host of `physical` bytes: a cgroup limit below the host's RAM
// is shared by the workers (and the coordinator), but each worker reports
// the whole of it, so the coordinator admitted N times the limit and the
// kernel killed workers once their stashes filled. "" when there is no
// such limit (each worker's own default is right then): the limit less an
// eighth (the coordinator and the processes' own overhead), over `workers`.
std::string SharedCgroupMemoryLimit(int64_t cgroup_limit, int64_t physical, int workers);

// Reads a paged list to its end: `page(token)` fetches the page at `token`
// ("" the first) and returns its next_page_token ("" on the last page).
// INTERNAL when the coordinator hands back a token it gave before (a
// cycle: the list would never end, and memory would grow).
absl::Status ReadAllPages(
    const std::function<absl::StatusOr<std::string>(const std::string&)>& page);

// The DOING column of `pipetrain workers`: the worker's current
// instruction, after "drained; " for a drained worker (it gets no job
// however READY it looks) and after "lost; last: " or "left; last: " for
// one that is gone (the coordinator keeps what it last did, which would
// read as current).
std::string WorkerDoing(const v1::Worker& worker);

// The flags each command's Run parses, described (for shell completion).
std::vector<FlagSet::Info> UpFlagInfo();
std::vector<FlagSet::Info> SubmitFlagInfo();
std::vector<FlagSet::Info> JobsFlagInfo();
std::vector<FlagSet::Info> JobFlagInfo();
std::vector<FlagSet::Info> CancelFlagInfo();
std::vector<FlagSet::Info> DrainFlagInfo();
std::vector<FlagSet::Info> WorkersFlagInfo();

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_CLUSTER_COMMANDS_H_
