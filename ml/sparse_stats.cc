#include "ml/sparse_stats.h"

#include <cstdint>

namespace chorus::ml {

KgAccessStats kgAccessStats(const KgData& data, double negativesPerTriple,
                            std::span<const double> negativePi) {
  sampling::AccessCounts entities(data.entities()), relations(data.relations());
  for (const Triple& t : data.train) {
    entities.add(t.head);
    entities.add(t.tail);
    relations.add(t.relation);
  }
  std::vector<double> uniform;
  if (negativePi.empty() && negativesPerTriple > 0.0 && data.entities() > 0) {
    uniform.assign(data.entities(), 1.0 / static_cast<double>(data.entities()));
    negativePi = uniform;
  }
  KgAccessStats stats;
  stats.entities = sampling::expectedAccesses(entities.dense(), negativePi, negativesPerTriple,
                                              static_cast<double>(data.train.size()));
  stats.relations = sampling::asAccesses(relations.dense());
  return stats;
}

KgAccessStats kgShardAccessStats(const KgData& data, std::span<const size_t> points,
                                 double negativesPerTriple) {
  sampling::AccessCounts entities(data.entities()), relations(data.relations());
  for (size_t i : points) {
    const Triple& t = data.train.at(i);
    entities.add(t.head);
    entities.add(t.tail);
    relations.add(t.relation);
  }
  std::vector<double> uniform;
  if (negativesPerTriple > 0.0 && data.entities() > 0) {
    uniform.assign(data.entities(), 1.0 / static_cast<double>(data.entities()));
  }
  KgAccessStats stats;
  stats.entities = sampling::expectedAccesses(entities.dense(), uniform, negativesPerTriple,
                                              static_cast<double>(points.size()));
  stats.relations = sampling::asAccesses(relations.dense());
  return stats;
}

MfAccessStats mfShardAccessStats(const RatingsData& data, std::span<const size_t> points) {
  sampling::AccessCounts rows(data.rows), cols(data.cols);
  for (size_t i : points) {
    const Rating& r = data.train.at(i);
    rows.add(r.row);
    cols.add(r.col);
  }
  return {sampling::asAccesses(rows.dense()), sampling::asAccesses(cols.dense())};
}

MfAccessStats mfAccessStats(const RatingsData& data) {
  sampling::AccessCounts rows(data.rows), cols(data.cols);
  for (const Rating& r : data.train) {
    rows.add(r.row);
    cols.add(r.col);
  }
  return {sampling::asAccesses(rows.dense()), sampling::asAccesses(cols.dense())};
}

std::vector<std::string> skewLines(const KgAccessStats& stats) {
  return {sampling::formatSkew("skew of entities", sampling::skewSummary(stats.entities)),
          sampling::formatSkew("skew of relations", sampling::skewSummary(stats.relations))};
}

std::vector<std::string> skewLines(const MfAccessStats& stats) {
  return {sampling::formatSkew("skew of rows (users)", sampling::skewSummary(stats.rows)),
          sampling::formatSkew("skew of columns (items)", sampling::skewSummary(stats.cols))};
}

}  // namespace chorus::ml
