// Writer vs reader: count, exactly and over every layer and page, the elements
// two layouts place at different (buffer, byte). Offsets are affine in (layer,
// page), so each (head, token, column) contributes a difference
// delta + layer * dLayer + page * dPage, and the count of (layer, page) where
// that is zero is found per distinct delta without visiting every page.
#include <map>
#include <sstream>

#include "nvfp4kv/core/layout.hpp"

namespace nvfp4kv {
namespace {

__extension__ typedef __int128 i128;

void require_same_dims(const Layout& w, const Layout& r) {
  const CacheDims &a = w.dims, &b = r.dims;
  std::ostringstream diff;
  if (a.layers != b.layers) diff << " layers " << a.layers << " vs " << b.layers << ";";
  if (a.pages != b.pages) diff << " pages " << a.pages << " vs " << b.pages << ";";
  if (a.tokens_per_page != b.tokens_per_page) diff << " tokens per page " << a.tokens_per_page << " vs " << b.tokens_per_page << ";";
  if (a.heads != b.heads) diff << " heads " << a.heads << " vs " << b.heads << ";";
  if (a.head_dim != b.head_dim) diff << " head dim " << a.head_dim << " vs " << b.head_dim << ";";
  if (!diff.str().empty())
    throw LayoutError(quote_text(w.name) + " and " + quote_text(r.name) + " describe different caches:" + diff.str());
}

const std::string& buffer_name(const Layout& l, Region r) { return l.buffers.at(size_t(l.region(r).buffer)).name; }

// (layer, page) pairs in [0, L) x [0, P) with layer * dl + page * dp == target.
int64_t count_solutions(int64_t target, int64_t dl, int64_t dp, int64_t L, int64_t P) {
  int64_t n = 0;
  for (int64_t l = 0; l < L; ++l) {
    const i128 rest = i128(target) - i128(l) * dl;
    if (dp == 0) {
      n += rest == 0 ? P : 0;
    } else if (rest % dp == 0) {
      const i128 page = rest / dp;
      n += (page >= 0 && page < P) ? 1 : 0;
    }
    if (dl == 0) return n * L;  // every layer alike
  }
  return n;
}

}  // namespace

CompareReport compare(const Layout& writer, const Layout& reader, int max_examples) {
  require_evaluable(writer);
  require_evaluable(reader);
  require_same_dims(writer, reader);
  const CacheDims& d = writer.dims;
  CompareReport rep;
  for (Region r : kAllRegions) {
    const int64_t total = d.layers * d.pages * d.heads * d.tokens_per_page * d.columns(r);
    rep.elements += total;
    if (buffer_name(writer, r) != buffer_name(reader, r)) {
      rep.misplaced_per_region[size_t(r)] = total;
      continue;
    }
    const RegionMap &mw = writer.region(r), &mr = reader.region(r);
    const bool w_layers = !writer.buffers[size_t(mw.buffer)].per_layer;
    const bool r_layers = !reader.buffers[size_t(mr.buffer)].per_layer;
    std::map<int64_t, int64_t> deltas;
    for (Coord c; c.head < d.heads; ++c.head)
      for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
        for (c.column = 0; c.column < d.columns(r); ++c.column) ++deltas[writer.offset(r, c) - reader.offset(r, c)];
    const int64_t dl = mw.layer - mr.layer, dp = mw.page - mr.page;
    // One allocation for all layers vs one per layer: only layer 0 can land in the same place.
    const int64_t layers = (w_layers != r_layers) ? 1 : d.layers;
    int64_t agree = 0;
    for (auto [delta, count] : deltas) agree += count * count_solutions(-delta, dl, dp, layers, d.pages);
    rep.misplaced_per_region[size_t(r)] = total - agree;
  }
  for (int64_t m : rep.misplaced_per_region) rep.misplaced += m;
  rep.agree = rep.misplaced == 0;
  // The first few, in (layer, page, region, head, token, column) order; bounded work.
  int64_t budget = int64_t(1) << 24;
  for (Coord c; c.layer < d.layers && rep.examples.size() < size_t(max_examples) && budget > 0 && !rep.agree; ++c.layer)
    for (c.page = 0; c.page < d.pages && rep.examples.size() < size_t(max_examples) && budget > 0; ++c.page)
      for (Region r : kAllRegions)
        for (c.head = 0; c.head < d.heads; ++c.head)
          for (c.token = 0; c.token < d.tokens_per_page; ++c.token)
            for (c.column = 0; c.column < d.columns(r); ++c.column) {
              if (rep.examples.size() >= size_t(max_examples) || --budget <= 0) goto done;
              const int64_t wb = writer.offset(r, c), rb = reader.offset(r, c);
              if (wb != rb || buffer_name(writer, r) != buffer_name(reader, r))
                rep.examples.push_back({r, c, buffer_name(writer, r), buffer_name(reader, r), wb, rb});
            }
done:
  return rep;
}

std::string CompareReport::summary(const std::string& w, const std::string& r) const {
  std::ostringstream s;
  if (agree) {
    s << "agree: \"" << w << "\" and \"" << r << "\" place all " << elements << " elements at the same bytes";
    return s.str();
  }
  s << "DISAGREE: \"" << w << "\" (writer) and \"" << r << "\" (reader) place " << misplaced << " of " << elements
    << " elements differently (";
  for (Region reg : kAllRegions)
    s << region_name(reg) << " " << misplaced_per_region[size_t(reg)] << (reg == Region::kVScale ? ")" : ", ");
  for (const Misplacement& m : examples)
    s << "\n  " << describe_element(m.region, m.coord) << ": writer byte " << m.writer_byte << " of \"" << m.writer_buffer
      << "\", reader byte " << m.reader_byte << " of \"" << m.reader_buffer << "\"";
  return s.str();
}

}  // namespace nvfp4kv
