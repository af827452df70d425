// The cluster subcommands of `pipetrain`:
//   up       start a coordinator and N workers here, train, show progress
//   submit   send a job spec (JSON or YAML) to a coordinator
//   jobs     list jobs;   job ID   one job as JSON;   cancel ID
//   workers  list workers
// Each returns the process exit code: 0 ok, 2 bad flags, 1 errors (the
// coordinator's status is printed with its code), 130 interrupted.
#ifndef PIPETRAIN_CLI_CLUSTER_COMMANDS_H_
#define PIPETRAIN_CLI_CLUSTER_COMMANDS_H_

#include <string>
#include <vector>

namespace pipetrain {

int RunUp(const std::vector<std::string>& args);
int RunSubmit(const std::vector<std::string>& args);
int RunJobs(const std::vector<std::string>& args);
int RunJob(const std::vector<std::string>& args);
int RunCancel(const std::vector<std::string>& args);
int RunDrain(const std::vector<std::string>& args);
int RunWorkers(const std::vector<std::string>& args);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_CLUSTER_COMMANDS_H_
