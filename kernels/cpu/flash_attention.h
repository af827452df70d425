// The CPU twin of kernels/cuda/flash_attention.h: the same algorithm and
// the same roundings in plain loops, so what the GPU kernels compute can be
// checked, and their tolerances against kernels/cpu/attention.h shown, on
// a machine without a GPU (flash_attention_test.cc). Layouts as
// attention.h: qkv [batch, seq_len, 3c], out [batch, seq_len, c], dqkv
// [batch, seq_len, 3c]; lse [batch, heads, seq_len].
//
// Forward, per (batch, head, query t), over the key tiles of
// kFlashTileKeys in ascending order up to t's (an online softmax):
//   s_j = bf16(q_t) . bf16(k_j) / sqrt(head_dim) for keys j <= t;
//   m' = max(m, max_j s_j); p_j = bf16(exp(s_j - m'));
//   l' = l exp(m - m') + sum_j p_j;  o' = o exp(m - m') + sum_j p_j bf16(v_j);
// then out_t = o / l and lse_t = m + log l.
// Backward, from p_tj = exp(s_tj - lse_t) and D_t = out_t . dout_t:
//   dp_tj = bf16(dout_t) . bf16(v_j);  ds_tj = p_tj (dp_tj - D_t) / sqrt(head_dim);
//   dv_j += bf16(p_tj) bf16(dout_t);  dk_j += bf16(ds_tj) bf16(q_t);
//   dq_t += bf16(ds_tj) bf16(k_j).
// Products accumulate in fp32 (the GPU's order differs: its results agree
// with these to fp32 rounding, up to a bf16 rounding that an fp32 difference
// tips the other way). Not optimised: O(seq_len^2 head_dim) per head.
// Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CPU_FLASH_ATTENTION_H_
#define PIPETRAIN_KERNELS_CPU_FLASH_ATTENTION_H_

namespace pipetrain {

// Keys per tile of the GPU kernels' online softmax (the rescaling happens
// once per tile, so the tile size is part of the result).
inline constexpr int kFlashTileKeys = 64;

// How close these (and the GPU kernels) come to attention.h's results on
// the same bf16-exact N(0, 1) inputs, |got - want| <= atol + rtol |want|
// (the bf16 roundings of P and dS; flash_attention_test.cc measures the
// margin).
inline constexpr float kFlashOutAtol = 1e-2f;
inline constexpr float kFlashGradAtol = 2e-2f;  // dq, dk, dv
inline constexpr float kFlashLseAtol = 4e-3f;   // against the log-sum-exp in double
inline constexpr float kFlashRtol = 1e-2f;      // out, dq, dk, dv

// x rounded to the nearest bf16 (ties to even), as a float; finite x (one
// beyond bf16's range gives the infinity of its sign).
float RoundToBf16(float x);

void FlashAttentionForward(const float* qkv, int batch, int seq_len, int c, int heads, float* out,
                           float* lse);

void FlashAttentionBackward(const float* qkv, const float* out, const float* lse, const float* dout,
                            int batch, int seq_len, int c, int heads, float* dqkv);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_FLASH_ATTENTION_H_
