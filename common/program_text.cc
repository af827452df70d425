#include "common/program_text.h"

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"

namespace pipetrain {

std::string DescribeInstruction(const v1::Instruction& in) {
  auto units = [](const v1::UnitRange& r) { return absl::StrCat("[", r.begin(), ", ", r.end(), ")"); };
  auto key = [](const v1::TensorKey& k) {
    return absl::StrCat(EnumShortName(k.kind()), " unit ", k.unit(), " mb ", k.micro_batch());
  };
  switch (in.op_case()) {
    case v1::Instruction::kForward:
      return absl::StrCat(in.forward().validation() ? "validation forward " : "forward ",
                          units(in.forward().units()), " mb ", in.forward().micro_batch());
    case v1::Instruction::kBackward:
      return absl::StrCat("backward ", units(in.backward().units()), " mb ",
                          in.backward().micro_batch());
    case v1::Instruction::kRecompute:
      return absl::StrCat("recompute ", units(in.recompute().units()), " mb ",
                          in.recompute().micro_batch());
    case v1::Instruction::kSend: {
      const v1::Instruction::Send& s = in.send();
      std::string text = absl::StrCat("send ", key(s.tensor()), " to stage ", s.peer_stage());
      if (!s.codec().empty()) absl::StrAppend(&text, " as ", s.codec());
      if (s.error_feedback()) absl::StrAppend(&text, s.flush_residual() ? " (error feedback, flush)" : " (error feedback)");
      return text;
    }
    case v1::Instruction::kRecv:
      return absl::StrCat("recv ", key(in.recv().tensor()), " from stage ",
                          in.recv().peer_stage());
    case v1::Instruction::kAddTiedGradient: return "add tied gradient";
    case v1::Instruction::kOptimizerStep:
      return absl::StrCat("optimizer step ", units(in.optimizer_step().units()));
    case v1::Instruction::OP_NOT_SET: break;
  }
  return "empty instruction";
}

}  // namespace pipetrain
