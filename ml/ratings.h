// Rating matrices for matrix factorization: MovieLens-style rating files, and Zipf-skewed
// ratings generated from a planted low-rank model (the workload of the NuPS and Lapse MF
// experiments, at any size).
#pragma once

#include <cstdint>
#include <string>

#include "ml/sparse_data.h"

namespace chorus::ml {

// Reads a rating file into a training and a test part. Two forms, told apart by the first line:
// - CSV, `user,item,rating[,timestamp]`, whose first line is a header when its third field is
//   not a number (MovieLens 20M / 25M / latest: `userId,movieId,rating,timestamp`);
// - `user::item::rating[::timestamp]` without a header (MovieLens 1M / 10M).
// User and item names may be any text; they get dense ids in order of first appearance. The
// timestamp is ignored. Each rating goes to the test part with probability `testShare`, drawn
// from `seed` (same file and seed, same split). Blank lines are skipped. Throws DataError naming
// the file and line: a line with other than 3 or 4 fields, an empty user or item, a rating that
// is not a finite number, an empty file, a damaged gzip stream, more than 2^32 - 1 users or
// items; std::invalid_argument for testShare outside [0, 1).
RatingsData readRatings(const std::string& path, double testShare, uint64_t seed);

// Writes `ratings` as CSV with the header `user,item,rating` (ids as numbers, values exact to
// float precision), so that other programs (bench/mf_reference.py) train on the same cells.
// Throws std::runtime_error naming the file when it cannot be written.
void writeRatingsCsv(const std::string& path, const std::vector<Rating>& ratings);

// The shape of a generated rating matrix.
struct ZipfRatingsOptions {
  // The defaults train to within 5% of the noise floor in 10 epochs (docs/ml.md). With 100k x 10k
  // and 5M cells most rows hold too few ratings to pin down a rank-16 row, and no model gets
  // near the floor.
  uint64_t rows = 10'000;       // users
  uint64_t cols = 2'000;        // items
  uint64_t cells = 10'000'000;  // revealed cells, train and test together
  double testShare = 0.1;       // each cell is a test cell with this probability
  int rank = 16;                // rank of the planted model
  double rowExponent = 1.1;     // Zipf exponent of the row (user) indices
  double colExponent = 1.1;     // Zipf exponent of the column (item) indices
  double noiseSigma = 0.3;      // standard deviation of the Gaussian noise on every value
  uint64_t seed = 1;
  // Refuse sizes whose generation needs more bytes than this; 0: 80% of this machine's memory.
  uint64_t memoryLimitBytes = 0;
};

// The bytes makeZipfRatings needs at its peak for `options` (the result, the planted factors and
// the two Zipf samplers).
uint64_t zipfRatingsBytes(const ZipfRatingsOptions& options);

// Generates `cells` ratings. Row and column of each cell are drawn independently: Zipf rank k
// (0 = most frequent) with probability proportional to 1/(k+1)^exponent, through the alias
// sampler of sampling/; ranks become ids through a seeded permutation, so the hot rows are
// spread over the id range instead of being the lowest ids. Cells are drawn with replacement: a
// hot cell can be revealed more than once, each time with its own noise (a repeated rating).
// The value of cell (i, j) is dot(U_i, V_j) + N(0, noiseSigma^2), with the planted factors'
// entries drawn from N(0, rank^-1/2), so that the signal dot(U_i, V_j) has variance 1 and the
// values have variance 1 + noiseSigma^2: noiseSigma is the test RMSE of the planted model
// itself, the floor any model can expect to reach. Deterministic from the seed; memory is
// O(cells + (rows + cols) * rank) (no dense matrix); 10M cells take a few seconds. Throws
// std::invalid_argument naming the option for sizes that are zero, out of range or need more
// memory than the limit.
RatingsData makeZipfRatings(const ZipfRatingsOptions& options);

}  // namespace chorus::ml
