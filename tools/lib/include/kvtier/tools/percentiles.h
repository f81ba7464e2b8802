// Percentiles of latency samples (nearest-rank).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvtier::tools {

// The p-th percentile (0 < p <= 100) of `samples`; 0 when empty. Sorts a copy.
inline double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(samples.size())));
  return samples[std::min(samples.size(), std::max<size_t>(rank, 1)) - 1];
}

}  // namespace kvtier::tools
