// The whole batch-1 forward pass of a Llama-family model on the CPU, in one call from Python:
// lingcode's native step (cpu_step.py says when the engine uses it).
//
// Why: a decode step of the 135M default model reads ~97 MB of 4-bit weights; at the memory
// bandwidth of two cores that is ~6 ms, while torch spent ~30 ms, mostly in the dispatch of ~600
// small ops and their OpenMP regions. Here two threads (Pool) run the whole step with five
// barriers per layer, and every matmul reads the GGUF's own blocks (cpu_blocks.h) against
// activations quantized to 8 bits, with integer dot products.
//
// Row-exact by construction, which lossless speculation needs: each token's numbers go through the
// same operations in the same order whatever the number of tokens in the step and the thread count.
// Per-token work (norms, biases, quantization, RoPE, SiLU, the attention's combine) is done for
// every token by every thread into its own buffers, so it never depends on how tokens are split; a
// matmul's output row for a token is one fixed chain of float operations over its blocks
// (cpu_blocks.h); attention is cpu_attention.h's chunked kernel, row-exact too.
//
// What differs between architectures comes from weights.py's table, as data: QKV biases (Qwen2), a
// norm on each head of Q and K (Qwen3), the head width (64 or 128).

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#endif

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cpu_attention.h"
#include "cpu_blocks.h"

// The kernels' loops over tokens and code lines are unrolled by hand-set pragmas: GCC left some
// rolled, which kept the accumulators in memory (a 3-token step then cost twice a 2-token one).

namespace lingcode::step {

using attention::f32x16;
using blocks::Act;
using blocks::GROUP;
using blocks::Matrix;

inline f32x16 loadv(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void storev(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }

// Sum of 16 lanes in a fixed order (a tree).
inline float hsum(f32x16 v) {
  float s[16];
  std::memcpy(s, &v, sizeof s);
  for (int w = 8; w; w /= 2)
    for (int i = 0; i < w; ++i) s[i] += s[i + w];
  return s[0];
}

// --- weights --------------------------------------------------------------------------------------

struct MappedFile {
  const uint8_t* data = nullptr;
  size_t size = 0;
  explicit MappedFile(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY);
    TORCH_CHECK(fd >= 0, "cannot open ", path);
    struct stat st;
    fstat(fd, &st);
    size = size_t(st.st_size);
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    TORCH_CHECK(p != MAP_FAILED, "cannot map ", path);
    data = static_cast<const uint8_t*>(p);
  }
  ~MappedFile() { munmap(const_cast<uint8_t*>(data), size); }
};
// A token embedding that is not the head's matrix: the file's own rows, read from the mapped file
// as tokens come (only the rows used ever take memory: 130 MB of a 1.5B model's 1.1 GB are
// embeddings, most of them never read).
struct Embedding {
  std::shared_ptr<MappedFile> file;
  int64_t type = 0, offset = 0, rows = 0, cols = 0, row_bytes = 0;

  void row(int64_t id, float* out) const {
    const int64_t block = blocks::layout(blocks::pack_of(type)).block, block_bytes = blocks::file_block_bytes(type);
    const uint8_t* src = file->data + offset + id * row_bytes;
    for (int64_t b = 0; b < cols / block; ++b) blocks::dequantize_block(type, src + b * block_bytes, out + b * block);
  }
};

// `bytes` of zeroed memory starting on a 2 MB boundary, advised to be backed by 2 MB pages (before
// the first touch, which is when the kernel decides).
inline at::Tensor huge_page_block(int64_t bytes) {
  constexpr int64_t HUGE_PAGE = int64_t(2) << 20;
  const auto up = [](int64_t n, int64_t to) { return (n + to - 1) / to * to; };
  const size_t mapped = size_t(up(bytes, HUGE_PAGE) + HUGE_PAGE);  // room to start on a 2 MB boundary
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "native step: cannot map ", mapped, " bytes for the weights");
  uint8_t* base = reinterpret_cast<uint8_t*>(up(reinterpret_cast<int64_t>(p), HUGE_PAGE));
  madvise(base, size_t(up(bytes, HUGE_PAGE)), MADV_HUGEPAGE);
  return at::from_blob(base, {bytes}, [p, mapped](void*) { munmap(p, mapped); }, at::kByte);
}

// The machine's read bandwidth as the step sees it: GB/s of the best of `rounds` passes of the
// step's threads summing `bytes` of huge-page memory (the limit no decode step passes; benchmarks).
double read_bandwidth(int64_t bytes, int64_t rounds) {
  const at::Tensor block = huge_page_block(bytes);
  float* data = reinterpret_cast<float*>(block.data_ptr<uint8_t>());
  const int64_t n = bytes / 4;
  at::parallel_for(0, n, 1 << 16, [&](int64_t a, int64_t b) { for (int64_t i = a; i < b; ++i) data[i] = float(i & 7); });
  double best = 0.0;
  std::vector<float> sums(at::get_num_threads() * 16);
  for (int64_t r = 0; r < rounds; ++r) {
    const auto started = std::chrono::steady_clock::now();
    at::parallel_for(0, n / 64, 1 << 10, [&](int64_t a, int64_t b) {
      f32x16 s0 = {}, s1 = {}, s2 = {}, s3 = {};
      for (int64_t i = a; i < b; ++i) {
        const float* p = data + 64 * i;
        s0 += loadv(p), s1 += loadv(p + 16), s2 += loadv(p + 32), s3 += loadv(p + 48);
      }
      storev(sums.data() + 16 * at::get_thread_num(), s0 + s1 + s2 + s3);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    best = std::max(best, double(bytes) / seconds / 1e9);
  }
  return best;
}

// A standalone matrix (tests, benchmarks): the parts stacked in order, in memory of its own.
Matrix repack(const std::string& path, int64_t cols, const std::vector<blocks::PartSpec>& parts) {
  MappedFile file(path);
  return blocks::repack(file.data, file.size, cols, parts);
}

// Every matrix of a model, (cols, parts) each, repacked straight into one block of memory that the
// kernel may back with 2 MB pages: a step streams all the weights, and on 4 KB pages it ran slower,
// its two threads waiting for each other more often. One block, written once: no second copy of
// the weights at load, and nothing left behind in the allocator's free lists.
std::vector<Matrix> load_matrices(const std::string& path,
                                  const std::vector<std::pair<int64_t, std::vector<blocks::PartSpec>>>& specs) {
  constexpr int64_t ALIGN = 64;
  const auto up = [](int64_t n, int64_t to) { return (n + to - 1) / to * to; };
  int64_t total = 0;
  for (const auto& [cols, parts] : specs)
    for (const auto& part : parts) {
      const auto [codes, meta] = blocks::part_bytes(std::get<0>(part), std::get<2>(part), cols);
      total += up(codes, ALIGN) + up(meta, ALIGN);
    }
  const at::Tensor block = huge_page_block(total);
  int64_t offset = 0;
  const blocks::Allocate from_block = [&](int64_t code_bytes, int64_t meta_bytes) {
    at::Tensor codes = block.narrow(0, offset, code_bytes);
    offset += up(code_bytes, ALIGN);
    at::Tensor meta = block.narrow(0, offset, meta_bytes);
    offset += up(meta_bytes, ALIGN);
    return std::make_pair(codes, meta);
  };
  MappedFile file(path);
  std::vector<Matrix> out;
  for (const auto& [cols, parts] : specs) out.push_back(blocks::repack(file.data, file.size, cols, parts, from_block));
  return out;
}

// x [T, cols] @ w.T, activations quantized as the step quantizes them (for tests and benchmarks).
at::Tensor matmul_op(const Matrix& w, const at::Tensor& x_in) {
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.cols, "matmul: x must be [T, cols]");
  const int64_t T = x.size(0);
  Act act;
  act.resize(T, w.cols);
  act.set_width(w.cols, w);
  for (int64_t t = 0; t < T; ++t) act.quantize(t, x.data_ptr<float>() + t * w.cols);
  at::Tensor out = at::empty({T, w.rows}, at::kFloat);
  blocks::matmul(w, act, T, out.data_ptr<float>(), w.rows, 0, w.rows / GROUP);
  return out;
}

// The matrix's weights as the kernels weigh them, [rows, cols] (tests: against gguf's dequantization).
at::Tensor dequantize_op(const Matrix& w) {
  at::Tensor out = at::empty({w.rows, w.cols}, at::kFloat);
  for (int64_t r = 0; r < w.rows; ++r) w.dequantize_row(r, out.data_ptr<float>() + r * w.cols);
  return out;
}

// --- elementwise, one token ---------------------------------------------------------------------

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  f32x16 ss = {};
  for (int64_t i = 0; i < n; i += 16) {
    const f32x16 v = loadv(x + i);
    ss += v * v;
  }
  const float r = 1.0f / std::sqrt(hsum(ss) / float(n) + eps);
  for (int64_t i = 0; i < n; i += 16) storev(out + i, loadv(x + i) * r * loadv(weight + i));
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) storev(x + i, loadv(x + i) + loadv(y + i));
}

// out = silu(g) * u (the FFN's gate), 16 at a time: the exp as one vector polynomial.
void silu_times(const float* g, const float* u, int64_t n, float* out) {
  typedef int32_t i32x16 __attribute__((vector_size(64)));
  for (int64_t i = 0; i < n; i += 16) {
    const f32x16 x = loadv(g + i);
    storev(out + i, x / (1.0f + attention::exp_poly<f32x16, i32x16>(-x)) * loadv(u + i));
  }
}

// Rotate-half RoPE on one head of d (the Hugging Face layout; weights.py unpermutes Llama's GGUF rows).
void rope(float* x, const float* cos, const float* sin, int64_t d) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const float a = x[i], b = x[i + d / 2];
    x[i] = a * cos[i] - b * sin[i];
    x[i + d / 2] = b * cos[i + d / 2] + a * sin[i + d / 2];
  }
}

// --- threads ----------------------------------------------------------------------------------------

// How long a thread spins before it sleeps: adaptive, per thread and call site, in nanoseconds (a
// pause instruction takes 2-4 times longer on one x86 CPU than on another). A step has ~150
// barriers. Where both threads have a core each, the wait is a few microseconds and spinning
// catches it. Where another process holds one of the two cores and the threads share the other,
// spinning holds the core the partner needs: libgomp's default (spin ~0.3 s) then cost a whole
// timeslice at every barrier (~0.6 s a step instead of ~3 ms), a fixed 66 us spin ~10 ms a step
// (docs/engine-notes.md). So the budget halves after a wait the partner ended later than the most
// it may spin (it was not running), and doubles after a shorter one (spinning would catch it). Judged
// by when the partner published, not when the sleeper woke: a wake-up alone takes 10-70 us here, so
// judging by it halved the budget at every barrier after an idle pause and never recovered (steps of
// 11 ms instead of 2.1 when requests came with pauses between them).
struct Spin {
  int64_t budget, most;  // ns
};

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Sleeping and waking. A waiter spins within its budget, then counts itself in `sleepers` and sleeps
// in the kernel while the word still holds `old` (the kernel checks, so a change between our check
// and the sleep is never slept through). A waker changes the word first and calls the kernel only
// if someone may sleep. Both sides are seq_cst, so either the waker sees the sleeper or the
// sleeper sees the new value. (With std::atomic's wait and notify_all, libstdc++ 12 skips the wake
// on a check of its own waiter count that a release store is not ordered before. The step once
// slept 15 minutes with every thread waiting; whether that was the cause is not established:
// docs/engine-notes.md.)
// A sleep also ends after 100 ms: should a wake-up still be lost somewhere, the step goes on
// (the wait re-checks its word) and the loss is counted (Step.lost_wakes), instead of a hang.
#if defined(__linux__)
// True if the sleep timed out.
inline bool sleep_while(std::atomic<uint32_t>& word, uint32_t old) {
  timespec most{0, 100'000'000};
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, old, &most, nullptr, 0) != 0 &&
         errno == ETIMEDOUT;
}
inline void wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}
#else
inline bool sleep_while(std::atomic<uint32_t>& word, uint32_t old) {
  word.wait(old, std::memory_order_seq_cst);
  return false;
}
inline void wake_all(std::atomic<uint32_t>& word) { word.notify_all(); }
#endif

constexpr int64_t LEAST_SPIN_NS = 500;
thread_local Spin barrier_spin{66'000, 66'000};
thread_local Spin idle_spin{660'000, 660'000};  // between steps, while the caller runs a little Python

// The caller and n - 1 helper threads running one function together, with a barrier. Helpers sleep
// between calls. One call at a time (the engine's worker thread).
class Pool {
 public:
  ~Pool() { resize(1); }

  void run(int n, const std::function<void(int, int)>& f) {
    resize(n);
    if (n == 1) return f(0, 1);
    task_ = &f;
    caller_cpu_.store(current_cpu(), std::memory_order_relaxed);
    running_.store(n - 1, std::memory_order_seq_cst);
    publish(epoch_, epoch_.load(std::memory_order_relaxed) + 1);
    f(0, n);
    for (uint32_t left = running_.load(std::memory_order_seq_cst); left != 0;) left = wait_while(running_, left, barrier_spin);
  }

  // Every thread of the call waits here until all have arrived.
  void barrier() {
    const uint32_t generation = generation_.load(std::memory_order_seq_cst);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == int(helpers_.size())) {
      arrived_.store(0, std::memory_order_relaxed);
      publish(generation_, generation + 1);
      return;
    }
    wait_while(generation_, generation, barrier_spin);
  }

  // How many times a wait went to sleep (tests: the sleeping path ran).
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // Sleeps that timed out although the word had changed (a wake-up lost): 0 unless something is wrong.
  uint64_t lost_wakes() const { return lost_wakes_.load(std::memory_order_relaxed); }

 private:
  static int64_t clock_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  // Publish a new value; a sleeper is woken, and told when the value changed.
  void publish(std::atomic<uint32_t>& word, uint32_t value) {
    word.store(value, std::memory_order_seq_cst);
    woke_sleeper(word);
  }

  void woke_sleeper(std::atomic<uint32_t>& word) {
    if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
    published_at_.store(clock_ns(), std::memory_order_release);
    wake_all(word);
  }

  // Wait until `word` is no longer `old`: spin within the budget, then sleep until woken.
  uint32_t wait_while(std::atomic<uint32_t>& word, uint32_t old, Spin& spin) {
    int64_t spun_until = 0;  // read the clock only once the wait is not a short one
    for (int i = 1;; ++i) {
      const uint32_t now = word.load(std::memory_order_acquire);
      if (now != old) {
        spin.budget = std::min(spin.most, 2 * spin.budget);
        return now;
      }
      cpu_relax();
      if (i % 16 == 0) {
        const int64_t t = clock_ns();
        if (spun_until == 0) spun_until = t + spin.budget;
        if (t >= spun_until) break;
      }
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    uint32_t now;
    while ((now = word.load(std::memory_order_seq_cst)) == old) {
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      if (sleep_while(word, old) && word.load(std::memory_order_seq_cst) != old &&
          published_at_.load(std::memory_order_acquire) < spun_until) {
        lost_wakes_.fetch_add(1, std::memory_order_relaxed);  // changed, and nobody woke us
      }
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    if (helper_) {
      step_aside();
    } else {
      caller_cpu_.store(current_cpu(), std::memory_order_relaxed);  // a wake-up may have moved it
    }
    // How long after our spin ended the partner published (<= 0: before we slept, or an older
    // publish); within the rest of a full budget (and a margin), spinning would have caught it.
    const int64_t late = published_at_.load(std::memory_order_acquire) - spun_until;
    const bool catchable = late < (spin.most - spin.budget) * 6 / 5;
    spin.budget = catchable ? std::min(spin.most, 2 * spin.budget) : std::max(LEAST_SPIN_NS, spin.budget / 2);
    return now;
  }

  void resize(int n) {
    if (int(helpers_.size()) == n - 1) return;
    stop_.store(true);
    publish(epoch_, epoch_.load(std::memory_order_relaxed) + 1);
    for (auto& t : helpers_) t.join();
    helpers_.clear();
    stop_.store(false);
    const uint32_t now = epoch_.load(std::memory_order_acquire);  // a helper's first task is the next one
    for (int i = 1; i < n; ++i) helpers_.emplace_back([this, i, n, now] { serve(i, n, now); });
  }

  // Where the caller and a helper share a CPU, the helper moves to another of the CPUs it may use,
  // checked when either wakes from a sleep (a wake-up is where the kernel places a thread anew). After
  // a pause the kernel tends to wake one beside its waker, and the two then take turns on one core,
  // each barrier a sleep and a wake-up, while the other core idles: steps of 11 ms instead of 2.1
  // when requests came with pauses between them (docs/engine-notes.md).
  static int current_cpu() {
#if defined(__linux__)
    return sched_getcpu();
#else
    return -1;
#endif
  }

  void step_aside() {
#if defined(__linux__)
    const int mine = current_cpu(), callers = caller_cpu_.load(std::memory_order_relaxed);
    if (mine < 0 || mine != callers) return;
    static thread_local cpu_set_t allowed = [] {
      cpu_set_t set;
      CPU_ZERO(&set);
      sched_getaffinity(0, sizeof(set), &set);
      return set;
    }();
    cpu_set_t others = allowed;
    CPU_CLR(callers, &others);
    if (CPU_COUNT(&others) > 0) sched_setaffinity(0, sizeof(others), &others);
#endif
  }

  void serve(int tid, int n, uint32_t seen) {
    helper_ = true;
    while (true) {
      seen = wait_while(epoch_, seen, idle_spin);
      if (stop_.load()) return;
      (*task_)(tid, n);
      if (running_.fetch_sub(1, std::memory_order_seq_cst) == 1) woke_sleeper(running_);
    }
  }

  static inline thread_local bool helper_ = false;
  std::vector<std::thread> helpers_;
  const std::function<void(int, int)>* task_ = nullptr;
  std::atomic<uint32_t> epoch_{0}, generation_{0}, running_{0};
  std::atomic<int> arrived_{0}, sleepers_{0};
  std::atomic<uint64_t> sleeps_{0}, lost_wakes_{0};
  std::atomic<int64_t> published_at_{0};  // when a sleeper was last woken (steady clock, ns)
  std::atomic<int> caller_cpu_{-1};        // where run()'s caller was when the step began
  std::atomic<bool> stop_{false};
};

// --- the step -------------------------------------------------------------------------------------

struct Layer {
  at::Tensor attn_norm, ffn_norm;
  at::Tensor qkv_bias, q_norm, k_norm;  // empty where the architecture has none
  Matrix wqkv, wo, w_gate_up, w_down;
  at::Tensor k_cache, v_cache;  // model.KVCache's f16 buffers: keys [1, KV, Lpad, D] viewed position-last
};

// What one thread keeps to itself: its copy of the residual stream and of every per-token result.
struct Private {
  std::vector<float> x, tmp, y;
  Act act;
};

// f(std::integral_constant<int64_t, D>) for the head widths the attention kernel is built for.
template <typename F>
void with_head_dim(int64_t d, F&& f) {
  if (d == 64) return f(std::integral_constant<int64_t, 64>{});
  if (d == 128) return f(std::integral_constant<int64_t, 128>{});
  TORCH_CHECK(false, "native step: heads of ", d, " (64 or 128 only)");
}

class Step {
 public:
  // inv_freq [head_dim / 2]: RoPE's frequencies; a position's angles are computed when it is fed
  // (a table of every position's would take 32 MB for a 32K context of 128-wide heads).
  // embedding: (path, ggml type, offset, rows, cols) of the file's token embedding, or None where it
  // is the head's matrix (tied).
  Step(int64_t dim, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t ffn_dim, double eps,
       int64_t max_len, at::Tensor inv_freq, at::Tensor norm, Matrix head,
       std::optional<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>> embedding)
      : dim_(dim), heads_(n_heads), kv_heads_(n_kv_heads), hd_(head_dim), ffn_(ffn_dim), max_len_(max_len),
        eps_(float(eps)), inv_freq_(inv_freq.to(at::kFloat).contiguous()), norm_(norm.to(at::kFloat).contiguous()),
        head_(std::move(head)) {
    if (embedding) {
      const auto& [path, type, offset, rows, cols] = *embedding;
      embed_.file = std::make_shared<MappedFile>(path);
      embed_.type = type, embed_.offset = offset, embed_.rows = rows, embed_.cols = cols;
      const int64_t block = blocks::layout(blocks::pack_of(type)).block;
      TORCH_CHECK(cols % block == 0, "native step: the embedding's rows are not whole blocks");
      embed_.row_bytes = cols / block * blocks::file_block_bytes(type);
      TORCH_CHECK(offset >= 0 && size_t(offset + rows * embed_.row_bytes) <= embed_.file->size,
                  "native step: the embedding is past the file's end");
      madvise(const_cast<uint8_t*>(embed_.file->data), embed_.file->size, MADV_RANDOM);  // rows as tokens come
    }
    const int64_t embed_rows = embed_.file ? embed_.rows : head_.rows, embed_cols = embed_.file ? embed_.cols : head_.cols;
    TORCH_CHECK(dim % 32 == 0 && ffn_dim % 32 == 0 && head_dim % 32 == 0, "native step: widths must be multiples of 32");
    TORCH_CHECK(n_heads % n_kv_heads == 0 && (head_dim == 64 || head_dim == 128), "native step: heads of 64 or 128 only");
    TORCH_CHECK(inv_freq_.numel() == head_dim / 2, "native step: RoPE frequencies");
    TORCH_CHECK(head_.cols == dim && embed_cols == dim && embed_rows == head_.rows, "native step: head shape");
    TORCH_CHECK(attention::MAX_ROWS >= n_heads / n_kv_heads, "native step: too many query heads per kv head");
  }

  void add_layer(at::Tensor attn_norm, at::Tensor ffn_norm, at::Tensor qkv_bias, at::Tensor q_norm, at::Tensor k_norm,
                 Matrix wqkv, Matrix wo, Matrix w_gate_up, Matrix w_down, at::Tensor k_cache, at::Tensor v_cache) {
    const int64_t q = heads_ * hd_, qkv = q + 2 * kv_heads_ * hd_;
    TORCH_CHECK(wqkv.rows == qkv && wqkv.cols == dim_ && wo.rows == dim_ && wo.cols == q &&
                    w_gate_up.rows == 2 * ffn_ && w_gate_up.cols == dim_ && w_down.rows == dim_ &&
                    w_down.cols == ffn_,
                "native step: a layer's weights have the wrong shapes");
    TORCH_CHECK(qkv_bias.numel() == 0 || qkv_bias.numel() == qkv, "native step: the QKV bias has the wrong size");
    TORCH_CHECK((q_norm.numel() == 0 && k_norm.numel() == 0) || (q_norm.numel() == hd_ && k_norm.numel() == hd_),
                "native step: Q/K norms have the wrong size");
    TORCH_CHECK(k_cache.scalar_type() == at::kHalf && v_cache.scalar_type() == at::kHalf,
                "native step: the KV cache must be f16");
    TORCH_CHECK(k_cache.size(1) == kv_heads_ && k_cache.size(3) == hd_ && k_cache.stride(2) == 1 &&
                    k_cache.stride(3) % attention::LANES == 0 && v_cache.stride(3) == 1,
                "native step: keys must be position-last (padded), values position-first");
    TORCH_CHECK(k_cache.size(2) >= max_len_ && v_cache.size(2) >= max_len_, "native step: cache too short");
    const auto f32 = [](const at::Tensor& t) { return t.to(at::kFloat).contiguous(); };
    layers_.push_back({f32(attn_norm), f32(ffn_norm), f32(qkv_bias), f32(q_norm), f32(k_norm), std::move(wqkv),
                       std::move(wo), std::move(w_gate_up), std::move(w_down), k_cache, v_cache});
  }

  int64_t weight_bytes() const {
    int64_t n = head_.bytes();
    for (const auto& l : layers_) n += l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes();
    return n;
  }

  // The memory the weights live in: (address, bytes) of each distinct block (load_matrices: one).
  std::vector<std::pair<int64_t, int64_t>> weight_storages() const {
    std::vector<const Matrix*> all{&head_};
    for (const auto& l : layers_) all.insert(all.end(), {&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down});
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const Matrix* m : all)
      for (const auto& p : m->parts) {
        const auto& storage = p.codes.storage();
        const std::pair<int64_t, int64_t> entry{reinterpret_cast<int64_t>(storage.data()), int64_t(storage.nbytes())};
        if (std::find(out.begin(), out.end(), entry) == out.end()) out.push_back(entry);
      }
    return out;
  }

  uint64_t sleeps() const { return pool_.sleeps(); }
  uint64_t lost_wakes() const { return pool_.lost_wakes(); }

  // Feed tokens [T] (int64) at positions start..start+T-1 through the first n_layers layers (all
  // when < 0); logits [T, V] of every position (all_logits) or [1, V] of the last one.
  at::Tensor forward(const at::Tensor& tokens_in, int64_t start, bool all_logits, int64_t n_layers) {
    at::Tensor logits;
    with_head_dim(hd_, [&](auto D) { logits = forward_<D>(tokens_in, start, all_logits, n_layers); });
    return logits;
  }

 private:

  template <int64_t HD>
  at::Tensor forward_(const at::Tensor& tokens_in, int64_t start, bool all_logits, int64_t n_layers) {
    const at::Tensor tokens = tokens_in.to(at::kLong).contiguous().view(-1);
    const int64_t T = tokens.numel(), end = start + T, vocab = head_.rows;
    TORCH_CHECK(T > 0 && start >= 0 && end <= max_len_, "native step: positions past the cache");
    const int64_t* ids = tokens.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t) TORCH_CHECK(ids[t] >= 0 && ids[t] < vocab, "native step: token id out of range");
    const int64_t L = n_layers < 0 ? int64_t(layers_.size()) : std::min<int64_t>(n_layers, layers_.size());
    const int64_t out_rows = all_logits ? T : 1;
    at::Tensor logits = at::empty({out_rows, vocab}, at::kFloat);

    const int64_t group = heads_ / kv_heads_, q_dim = heads_ * HD, kv_dim = kv_heads_ * HD;
    const int64_t qkv_dim = q_dim + 2 * kv_dim, widest = std::max({dim_, ffn_, q_dim});
    const float scale = 1.0f / std::sqrt(float(HD));  // as llama.cpp's kq_scale
    const int64_t nth = std::max(1, at::get_num_threads());
    // attention tasks: (kv head, tile of query tokens, chunk of positions); partials in task order
    const int64_t tile_tokens = attention::MAX_ROWS / group;
    struct Task {
      int64_t h, t0, tn, chunk, chunks, at;
    };
    std::vector<Task> tasks;
    int64_t partial_rows = 0;
    for (int64_t h = 0; h < kv_heads_; ++h)
      for (int64_t t0 = 0; t0 < T; t0 += tile_tokens) {
        const int64_t tn = std::min(tile_tokens, T - t0), chunks = (start + t0 + tn - 1) / attention::CHUNK + 1;
        for (int64_t c = 0; c < chunks; ++c) tasks.push_back({h, t0, tn, c, chunks, partial_rows + c * group * tn});
        partial_rows += chunks * group * tn;
      }
    qkv_.resize(T * qkv_dim);
    o_.resize(T * dim_);
    gu_.resize(T * 2 * ffn_);
    m_.resize(partial_rows);
    s_.resize(partial_rows);
    acc_.resize(partial_rows * HD);
    private_.resize(nth);
    for (auto& p : private_) {
      p.x.resize(T * dim_);
      p.tmp.resize(widest);
      p.y.resize(T * q_dim);
      p.act.resize(T, widest);
    }
    // each token's RoPE cos and sin, rotate-half layout [T, HD] as model.py's tables (f32 angles, as theirs)
    cos_.resize(T * HD);
    sin_.resize(T * HD);
    const float* inv_freq = inv_freq_.data_ptr<float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < HD / 2; ++i) {
        const float angle = float(start + t) * inv_freq[i];
        cos_[t * HD + i] = cos_[t * HD + HD / 2 + i] = std::cos(angle);
        sin_[t * HD + i] = sin_[t * HD + HD / 2 + i] = std::sin(angle);
      }
    float *qkv = qkv_.data(), *o = o_.data(), *gu = gu_.data();
    const float *cos = cos_.data(), *sin = sin_.data();

    pool_.run(int(nth), [&](int tid, int n) {
      auto share = [&](int64_t total) {  // this thread's [begin, end) of `total` items
        return std::make_pair(total * tid / n, total * (tid + 1) / n);
      };
      Private& me = private_[tid];
      float *x = me.x.data(), *tmp = me.tmp.data(), *y = me.y.data();
      Act& act = me.act;
      for (int64_t t = 0; t < T; ++t) {
        if (embed_.file)
          embed_.row(ids[t], x + t * dim_);
        else  // tied: the head's rows
          head_.dequantize_row(ids[t], x + t * dim_);
      }

      for (int64_t l = 0; l < L; ++l) {
        const Layer& layer = layers_[l];
        act.set_width(dim_, layer.wqkv);
        for (int64_t t = 0; t < T; ++t) {
          rms_norm(x + t * dim_, layer.attn_norm.data_ptr<float>(), dim_, eps_, tmp);
          act.quantize(t, tmp);
        }
        // Q, K, V split by heads, so that each thread finishes and caches the heads it computed
        const auto [h0, h1] = share(heads_ + 2 * kv_heads_);
        blocks::matmul(layer.wqkv, act, T, qkv, qkv_dim, h0 * HD / GROUP, h1 * HD / GROUP);
        auto* kc = static_cast<uint16_t*>(layer.k_cache.data_ptr());
        auto* vc = static_cast<uint16_t*>(layer.v_cache.data_ptr());
        const int64_t ks1 = layer.k_cache.stride(1), ks3 = layer.k_cache.stride(3);
        const int64_t vs1 = layer.v_cache.stride(1), vs2 = layer.v_cache.stride(2);
        const float* bias = layer.qkv_bias.numel() ? layer.qkv_bias.data_ptr<float>() : nullptr;
        const bool qk_norm = layer.q_norm.numel() > 0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t t = 0; t < T; ++t) {
            float* head = qkv + t * qkv_dim + h * HD;
            const int64_t pos = start + t;
            if (bias)
              for (int64_t d = 0; d < HD; ++d) head[d] += bias[h * HD + d];
            if (h < heads_ + kv_heads_) {
              if (qk_norm) rms_norm(head, (h < heads_ ? layer.q_norm : layer.k_norm).data_ptr<float>(), HD, eps_, head);
              rope(head, cos + t * HD, sin + t * HD, HD);
            }
            if (h >= heads_ + kv_heads_) {
              uint16_t* dst = vc + (h - heads_ - kv_heads_) * vs1 + pos * vs2;
              for (int64_t d = 0; d < HD; ++d) dst[d] = attention::float_to_half(head[d]);
            } else if (h >= heads_) {
              uint16_t* dst = kc + (h - heads_) * ks1 + pos;
              for (int64_t d = 0; d < HD; ++d) dst[d * ks3] = attention::float_to_half(head[d]);
            }
          }
        pool_.barrier();
        // attention: the tasks round-robin over threads (a row's numbers do not depend on who runs it)
        for (size_t i = tid; i < tasks.size(); i += n) {
          const Task& task = tasks[i];
          const int64_t rows = group * task.tn, l0 = task.chunk * attention::CHUNK;
          const int64_t len = std::min(attention::CHUNK, start + task.t0 + task.tn - l0);
          alignas(64) float q_rows[attention::MAX_ROWS * HD];
          int64_t visible[attention::MAX_ROWS];
          for (int64_t g = 0; g < group; ++g)
            for (int64_t i = 0; i < task.tn; ++i) {
              const int64_t r = g * task.tn + i;
              const float* src = qkv + (task.t0 + i) * qkv_dim + (task.h * group + g) * HD;
              for (int64_t d = 0; d < HD; ++d) q_rows[r * HD + d] = src[d] * scale;
              visible[r] = std::clamp<int64_t>(start + task.t0 + i + 1 - l0, 0, len);
            }
          attention::Ahead ahead;
          if (i + n < tasks.size()) {
            const Task& next = tasks[i + n];
            const int64_t nl0 = next.chunk * attention::CHUNK;
            ahead = attention::Ahead(kc + next.h * ks1 + nl0, ks3, vc + next.h * vs1 + nl0 * vs2, vs2, HD,
                                     std::min(attention::CHUNK, start + next.t0 + next.tn - nl0));
          }
          attention::chunk_attention<HD, attention::F16>(
              q_rows, rows, visible, kc + task.h * ks1 + l0, ks3, vc + task.h * vs1 + l0 * vs2, vs2, len,
              m_.data() + task.at, s_.data() + task.at, acc_.data() + task.at * HD, ahead);
        }
        pool_.barrier();
        // every thread combines every row into its own y (cheap; saves a barrier), then O
        for (size_t i = 0; i < tasks.size(); ++i) {
          const Task& task = tasks[i];
          if (task.chunk != 0) continue;
          const int64_t rows = group * task.tn;
          for (int64_t g = 0; g < group; ++g)
            for (int64_t j = 0; j < task.tn; ++j) {
              const int64_t at = task.at + g * task.tn + j;
              attention::combine_chunks<HD>(task.chunks, m_.data() + at, s_.data() + at, acc_.data() + at * HD, rows,
                                            y + (task.t0 + j) * q_dim + (task.h * group + g) * HD);
            }
        }
        act.set_width(q_dim, layer.wo);
        for (int64_t t = 0; t < T; ++t) act.quantize(t, y + t * q_dim);
        {
          const auto [g0, g1] = share(dim_ / GROUP);
          blocks::matmul(layer.wo, act, T, o, dim_, g0, g1);
        }
        pool_.barrier();
        act.set_width(dim_, layer.w_gate_up);
        for (int64_t t = 0; t < T; ++t) {
          add(x + t * dim_, o + t * dim_, dim_);
          rms_norm(x + t * dim_, layer.ffn_norm.data_ptr<float>(), dim_, eps_, tmp);
          act.quantize(t, tmp);
        }
        {
          const auto [g0, g1] = share(2 * ffn_ / GROUP);
          blocks::matmul(layer.w_gate_up, act, T, gu, 2 * ffn_, g0, g1);
        }
        pool_.barrier();
        act.set_width(ffn_, layer.w_down);
        for (int64_t t = 0; t < T; ++t) {
          const float* g = gu + t * 2 * ffn_;
          silu_times(g, g + ffn_, ffn_, tmp);
          act.quantize(t, tmp);
        }
        {
          const auto [g0, g1] = share(dim_ / GROUP);
          blocks::matmul(layer.w_down, act, T, o, dim_, g0, g1);
        }
        pool_.barrier();
        for (int64_t t = 0; t < T; ++t) add(x + t * dim_, o + t * dim_, dim_);
      }

      act.set_width(dim_, head_);
      const int64_t first = T - out_rows;
      for (int64_t t = first; t < T; ++t) {
        rms_norm(x + t * dim_, norm_.data_ptr<float>(), dim_, eps_, tmp);
        act.quantize(t - first, tmp);
      }
      const auto [g0, g1] = share(vocab / GROUP);
      blocks::matmul(head_, act, out_rows, logits.data_ptr<float>(), vocab, g0, g1);
    });
    return logits;
  }

  int64_t dim_, heads_, kv_heads_, hd_, ffn_, max_len_;
  float eps_;
  at::Tensor inv_freq_, norm_;
  Matrix head_;
  Embedding embed_;
  std::vector<Layer> layers_;
  std::vector<float> qkv_, o_, gu_, m_, s_, acc_, cos_, sin_;
  std::vector<Private> private_;
  Pool pool_;
};

}  // namespace lingcode::step

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace lingcode::step;
  namespace py = pybind11;
  py::class_<Matrix>(m, "Matrix")
      .def_readonly("rows", &Matrix::rows)
      .def_readonly("cols", &Matrix::cols)
      .def("types", &Matrix::types)
      .def("nbytes", &Matrix::bytes)
      .def("matmul", &matmul_op, py::call_guard<py::gil_scoped_release>())
      .def("dequantize", &dequantize_op, py::call_guard<py::gil_scoped_release>());
  m.def("repack", &repack, py::arg("path"), py::arg("cols"), py::arg("parts"), py::call_guard<py::gil_scoped_release>());
  m.def("read_bandwidth", &read_bandwidth, py::arg("bytes"), py::arg("rounds") = 5,
        py::call_guard<py::gil_scoped_release>());
  m.def("load_matrices", &load_matrices, py::arg("path"), py::arg("specs"), py::call_guard<py::gil_scoped_release>());
  py::class_<Step>(m, "Step")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t, at::Tensor, at::Tensor, Matrix,
                    std::optional<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>>>())
      .def("add_layer", &Step::add_layer)
      .def("weight_bytes", &Step::weight_bytes)
      .def("weight_storages", &Step::weight_storages)
      .def("sleeps", &Step::sleeps)
      .def("lost_wakes", &Step::lost_wakes)
      .def("forward", &Step::forward, py::arg("tokens"), py::arg("start"), py::arg("all_logits") = false,
           py::arg("n_layers") = -1, py::call_guard<py::gil_scoped_release>());
  m.def("isa", &lingcode::blocks::isa);
}
