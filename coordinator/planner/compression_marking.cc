#include "coordinator/planner/compression_marking.h"

#include <map>
#include <string>
#include <utility>

#include "kernels/compress/codec_spec.h"

namespace pipetrain {
namespace {

std::string CodecOrRaw(const std::string& codec) { return codec == kCodecNone ? "" : codec; }

void MarkProgram(const v1::CompressionSpec& c, v1::Program* program) {
  int last_forward = -1;
  for (int i = 0; i < program->instructions_size(); ++i) {
    if (program->instructions(i).has_forward()) last_forward = i;
  }
  const std::string forward = CodecOrRaw(c.forward());
  const std::string backward = CodecOrRaw(c.backward());
  // The last error-feedback send per (peer, unit) link, to flush there.
  std::map<std::pair<int, int>, v1::Instruction::Send*> last_feedback;
  for (int i = 0; i < program->instructions_size(); ++i) {
    if (!program->instructions(i).has_send()) continue;
    v1::Instruction::Send* send = program->mutable_instructions(i)->mutable_send();
    send->clear_codec();
    send->clear_error_feedback();
    send->clear_flush_residual();
    send->clear_epilogue();
    switch (send->tensor().kind()) {
      case v1::TENSOR_KIND_ACTIVATION:
        send->set_codec(forward);
        break;
      case v1::TENSOR_KIND_ACTIVATION_GRAD: {
        send->set_epilogue(i > last_forward);
        if (backward.empty() || (c.epilogue_only() && !send->epilogue())) break;
        send->set_codec(backward);
        if (c.error_feedback()) {
          send->set_error_feedback(true);
          last_feedback[{send->peer_stage(), send->tensor().unit()}] = send;
        }
        break;
      }
      default:
        break;  // tied gradients and weight syncs stay raw
    }
  }
  for (auto& [link, send] : last_feedback) send->set_flush_residual(true);
}

}  // namespace

void MarkCompression(const v1::CompressionSpec& compression, std::vector<v1::Program>* programs) {
  for (v1::Program& program : *programs) MarkProgram(compression, &program);
}

}  // namespace pipetrain
