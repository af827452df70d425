#include "coordinator/planner/compression_marking.h"

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/codec_spec.h"

namespace pipetrain {
namespace {

std::string CodecOrRaw(const std::string& codec) { return codec == kCodecNone ? "" : codec; }

// The units whose outputs must stay raw for the recomputes (Bi-Partition):
// a recompute of units [a, b) on worker W rebuilds their contexts from
// unit a - 1's output and each from the last, so the forward passes it
// stands for must have run on the same values. A lossy copy made the
// recompute save contexts the forward never had, and the backward applied
// the real forward's gradient at another point (with token top-k, to
// zeroed rows). So raw: the outputs of units a .. b - 2 (where the forward
// crossed between workers inside the run, W recomputes from exact values);
// and unit a - 1's where the forward of unit a ran on the exact value (the
// same worker forwarded a - 1 and a) or W holds it exactly (W forwarded
// a - 1). Otherwise unit a's forward and W's recompute decode the same
// payload, and it may stay compressed; unless the forward codec keeps
// state per link (`stateful_forward`: PowerSGD's warm start): the two
// links' encodings of one tensor then differ once their states do (after
// a resume onto another plan, a link kept from the old plan restores its
// warm start while a new one starts afresh).
std::set<int> RecomputedInputs(const std::vector<v1::Program>& programs, bool stateful_forward) {
  std::map<int, int> forwarded_by;  // unit -> program
  for (int w = 0; w < static_cast<int>(programs.size()); ++w) {
    for (const v1::Instruction& in : programs[w].instructions()) {
      if (!in.has_forward()) continue;
      const v1::UnitRange& r = in.forward().units();
      for (int u = r.begin(); u < r.end(); ++u) forwarded_by[u] = w;
    }
  }
  const auto owner = [&forwarded_by](int unit) {
    auto it = forwarded_by.find(unit);
    return it == forwarded_by.end() ? -1 : it->second;
  };
  std::set<int> units;
  for (int w = 0; w < static_cast<int>(programs.size()); ++w) {
    for (const v1::Instruction& in : programs[w].instructions()) {
      if (!in.has_recompute()) continue;
      const v1::UnitRange& r = in.recompute().units();
      for (int u = r.begin(); u + 1 < r.end(); ++u) units.insert(u);
      const int input = r.begin() - 1;
      if (input >= 0 &&
          (stateful_forward || owner(input) == owner(r.begin()) || owner(input) == w)) {
        units.insert(input);
      }
    }
  }
  return units;
}

// `exact_outputs`: the units whose activations stay raw (RecomputedInputs).
void MarkProgram(const v1::CompressionSpec& c, const std::set<int>& exact_outputs,
                 v1::Program* program) {
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
        if (exact_outputs.count(send->tensor().unit()) == 0) send->set_codec(forward);
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

// Each Recv gets the codec of the Send it is matched to: the same tensor,
// sent by its peer stage to this one ("none" when that Send is raw); a Recv
// that no Send matches gets none of its own, as before the marking.
void MarkRecvCodecs(std::vector<v1::Program>* programs) {
  using LinkTensor = std::tuple<int, int, int, int, int>;  // from, to, kind, micro_batch, unit
  auto link_tensor = [](int from, int to, const v1::TensorKey& t) {
    return LinkTensor{from, to, t.kind(), t.micro_batch(), t.unit()};
  };
  std::map<LinkTensor, std::string> sent;
  for (size_t s = 0; s < programs->size(); ++s) {
    for (const v1::Instruction& in : (*programs)[s].instructions()) {
      if (!in.has_send()) continue;
      const std::string& codec = in.send().codec();
      sent[link_tensor(static_cast<int>(s), in.send().peer_stage(), in.send().tensor())] =
          codec.empty() ? kCodecNone : codec;
    }
  }
  for (size_t s = 0; s < programs->size(); ++s) {
    for (v1::Instruction& in : *(*programs)[s].mutable_instructions()) {
      if (!in.has_recv()) continue;
      v1::Instruction::Recv* recv = in.mutable_recv();
      auto it = sent.find(link_tensor(recv->peer_stage(), static_cast<int>(s), recv->tensor()));
      if (it == sent.end()) {
        recv->clear_codec();
      } else {
        recv->set_codec(it->second);
      }
    }
  }
}

}  // namespace

void MarkCompression(const v1::CompressionSpec& compression, std::vector<v1::Program>* programs) {
  bool stateful_forward = false;
  if (absl::StatusOr<std::vector<CodecStage>> stages = ParseCodecSpec(compression.forward());
      stages.ok()) {
    for (const CodecStage& stage : *stages) stateful_forward |= stage.name == "powersgd";
  }
  const std::set<int> exact_outputs = RecomputedInputs(*programs, stateful_forward);
  for (v1::Program& program : *programs) MarkProgram(compression, exact_outputs, &program);
  MarkRecvCodecs(programs);
}

absl::StatusOr<std::map<std::string, double>> LinkCodecWireFractions(
    const v1::CompressionSpec& compression, int64_t micro_batch_size, int64_t seq_len,
    int64_t d_model) {
  if (micro_batch_size < 1 || seq_len < 1 || d_model < 1) {
    return absl::InvalidArgumentError(absl::StrCat("an activation [", micro_batch_size, ", ",
                                                   seq_len, ", ", d_model, "] has no bytes"));
  }
  const Shape shape = {micro_batch_size, seq_len, d_model};
  const double fp32 = 4.0 * static_cast<double>(micro_batch_size) * static_cast<double>(seq_len) *
                      static_cast<double>(d_model);
  std::map<std::string, double> out;
  for (const std::string& spec : {compression.forward(), compression.backward()}) {
    if (spec.empty() || spec == kCodecNone || out.count(spec) > 0) continue;
    ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeCodec(spec));
    const int64_t encoded = codec->EncodedBytes(shape);
    if (encoded < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec, " cannot encode an activation of ", fp32, " bytes"));
    }
    out[spec] = static_cast<double>(encoded) / fp32;
  }
  return out;
}

}  // namespace pipetrain
