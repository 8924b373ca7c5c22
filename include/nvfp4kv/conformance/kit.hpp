#pragma once
// The conformance kit: inputs for an engine's own writer and reader, built so that
// a byte found anywhere tells whose it is, and what nvfp4kv's reference makes of
// them through a layout (docs/conformance.md).
//
// Every 16-element block (row, head, side, group) carries a signature:
//   - its magnitude: the block scale (E4M3) is a digit of its row's number, so the
//     sd scales of a (row, head, side) spell that row, group 0 from a marker set of
//     four codes (16, 20, 24, 28) no other group uses, groups 1.. from 28 others;
//   - its codes: element 0 is +6 (the block maximum, so the scale is exact), elements
//     1..13 are thirteen base-15 digits of the block's number (never -0, so a writer
//     that drops the sign of a zero cannot lose one), element 14 a check digit;
//   - element 15: another check digit, or in about one block in eight a rounding
//     probe, a value exactly on an E2M1 tie where the rounding policies part ways.
// Data bytes 0..6 of a block (its key) are the same under every rounding policy and
// unique over the kit; so are the scale rows. Every value is e2m1 x scale x global
// scale and exact in bf16 and fp16: with global scales 1.75 * 2^-k the product has at
// most 8 significant bits.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4kv/conformance/rounding.hpp"
#include "nvfp4kv/core/layout.hpp"
#include "nvfp4kv/core/half.hpp"

namespace nvfp4kv::conformance {

// What every cache byte holds before the store: two E2M1 -0 codes, a value no
// generated data or scale byte takes, so any byte a writer wrote differs from it.
inline constexpr uint8_t kPoison = 0x88;
inline constexpr int kKitVersion = 1;  // of the files and the manifest (docs/conformance.md)

struct KitOptions {
  int64_t tokens = 0;  // rows stored, in sequences (padding rows come on top); 0: half the cache, at most 512
  ElementType type = ElementType::kBFloat16;  // of the rows and the query: bf16 or fp16
  int64_t layer = 0;   // the layer written and read
  int64_t q_heads = 0; // query heads of the attention probes, a multiple of the kv heads; 0: as many
  uint64_t seed = 1;
};

// A block of 16 elements of the input rows: row (padding rows included), head, side, group.
struct BlockId {
  int64_t row = 0, head = 0;
  Side side = Side::kK;
  int64_t group = 0;
};

struct KitSequence {
  std::vector<int32_t> pages;  // its block table: page k holds positions [k N, (k + 1) N)
  int64_t length = 0;
  int64_t first_read_row = 0;  // its first row in the reader's dense output
};

struct Kit {
  KitOptions options;
  std::optional<ValidLayout> valid;  // always set by generate and load_kit
  const Layout& layout() const { return valid->layout(); }
  const CacheDims& dims() const { return valid->layout().dims; }
  float k_global_scale = 0, v_global_scale = 0;  // dequant multipliers (docs/format.md)
  float global_scale(Side s) const { return s == Side::kK ? k_global_scale : v_global_scale; }

  // The writer's inputs.
  int64_t rows = 0;                          // input rows, padding included
  std::vector<uint16_t> k, v;                // (rows, heads, D) of options.type
  std::vector<int64_t> slots;                // (rows): page * N + position, -1 for padding
  std::vector<KitSequence> sequences;        // the stored rows, in sequences over shuffled pages
  std::vector<int64_t> row_sequence, row_position;  // (rows): each row's sequence and position in it, -1 for padding
  std::vector<std::vector<uint8_t>> cache;   // indexed like layout().buffers: the reference store, kPoison elsewhere

  // The reader's: the cache above, read as sequences into dense rows.
  std::vector<int64_t> read_rows;  // (R): the input row of each dense output row
  std::vector<float> read_k, read_v;  // (R, heads, D): the cache dequantized through the layout

  // Attention probes: one decode query per stored token, over that token's whole
  // sequence, whose logits single the token out (by at least kProbeMargin), so the
  // output is that token's V row as the reader read it.
  int64_t q_heads = 0;
  float softmax_scale = 0;
  std::vector<uint16_t> q;               // (probes, q_heads, D) of options.type
  std::vector<int32_t> probe_sequence;   // (probes)
  std::vector<int32_t> probe_position;   // (probes): the position in its sequence each probe singles out
  std::vector<uint8_t> probe_isolates;   // (probes, q_heads): the margin held after rounding the query
  std::vector<float> expected_out;       // (probes, q_heads, D): fp64 reference decode attention

  // Facts about the signatures.
  bool scale_rows_unique = true;         // false only when sd < 4 and there are more rows than codes
  int64_t probe_blocks = 0;
  std::array<int64_t, kRoundingPolicyCount> bytes_differing{};  // stored bytes each policy writes unlike nvfp4kv

  int64_t probes() const { return int64_t(probe_sequence.size()); }
  int64_t block_count() const;               // rows * heads * 2 * sd
  int64_t block_index(const BlockId& b) const;
  BlockId block(int64_t index) const;
  // The 16 input values of a block as floats.
  void block_values(const BlockId& b, float* x) const;
  // Where a row's cells are: (page, position), or nullopt for padding.
  std::optional<std::pair<int64_t, int64_t>> cell(int64_t row) const;
};

inline constexpr double kProbeMargin = 30;  // logits: exp(-30) of leak per other token

// Throws ArgumentError saying what to change (sizes past the kit's bounds, a
// cache without pages for the tokens, q_heads not a multiple of the kv heads).
Kit generate(const ValidLayout& layout, const KitOptions& options);

// The files of docs/conformance.md into dir (created if missing): .npy arrays, one
// .bin per cache buffer and manifest.json. Throws Error when a file cannot be written.
void write_kit(const Kit& kit, const std::string& dir);

// What manifest.json records: enough to generate the kit again.
struct KitManifest {
  int version = 0;
  std::string layout_json;  // the concrete layout the kit was generated for
  CacheDims dims;
  KitOptions options;
};
KitManifest read_manifest(const std::string& dir);  // throws Error naming the file and the problem

// The kit of dir, generated again from its manifest for `layout`, which must be
// the layout it was generated for; the cache files must hold what this nvfp4kv
// generates. Throws Error saying which differs.
Kit load_kit(const std::string& dir, const ValidLayout& layout);

// The E4M3 scale code of block (row id, group): row id = (row * heads + head) * 2 + side.
uint8_t signature_scale(const CacheDims& d, int64_t row_id, int64_t group);
// Whether a scale code starts a scale row (the marker set of group 0).
bool is_row_marker(uint8_t code);

}  // namespace nvfp4kv::conformance
