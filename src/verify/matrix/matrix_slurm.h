// `matrix plan --slurm` (docs/matrix.md §Slurm): the plan as Slurm batch scripts. One job
// array per number of GPUs a plan line needs, one array task per trace (and, with [gate], per
// model's gate), a report job that waits for every array to end, and a script that submits
// them in that order.
//
// DIR/slurm/traces-cpu.sbatch   ref, cpu and endpoint arms: no GPU requested
// DIR/slurm/traces-gpuN.sbatch  cuda arms: --gres=gpu:N (cuda and cuda:0 need 1, cuda:K K+1)
// DIR/slurm/report.sbatch       arbiter matrix report DIR
// DIR/slurm/submit.sh           sbatch --parsable for each array, then the report job with
//                               --dependency=afterany on them; writes DIR/slurm/jobs.txt
// DIR/slurm/logs/               one log per array task (%x-%A_%a.out) and the report's
#pragma once
#include <string>
#include <vector>

#include "verify/matrix/matrix_run.h"

namespace arbiter::verify {

constexpr const char* kMatrixSlurmDir = "slurm";

struct MatrixSlurmFile {
  std::string name;  // inside DIR/slurm
  std::string text;
};

/// GPUs a trace of arm needs on its node: 0 off the cuda tier, 1 for cuda and cuda:0, K+1 for
/// cuda:K (Slurm makes only the allocated GPUs visible, numbered from 0).
int matrix_arm_gpus(const MatrixArm& arm);

/// The scripts for the planned lines (matrix_plan(spec, opt, ...)); array task i of an array
/// runs its i-th line. Throws arbiter::Error when lines is empty (nothing to submit) or when
/// DIR holds a character that an #SBATCH line cannot carry.
std::vector<MatrixSlurmFile> matrix_slurm_scripts(const MatrixSpec& spec,
                                                  const std::vector<MatrixPlanLine>& lines,
                                                  const MatrixRunOptions& opt);

/// Plans (matrix_plan), writes the scripts into DIR/slurm (array scripts of an earlier plan are
/// removed, logs kept) and returns the absolute path of submit.sh.
std::string matrix_slurm_plan(const MatrixSpec& spec, const MatrixRunOptions& opt, bool all);

}  // namespace arbiter::verify
