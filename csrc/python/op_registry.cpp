// The registry behind XT_BIND_OPS (op_registry.h): a list filled during static initialisation,
// run once by module.cpp in the order of the family names.
#include "python/op_registry.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace xt {

namespace {

// A function-local static: constructed on first use, whichever file registers first.
std::vector<std::pair<std::string, OpsInit>>& registry() {
  static std::vector<std::pair<std::string, OpsInit>> entries;
  return entries;
}

}  // namespace

bool register_ops_binding(const char* family, OpsInit init) {
  registry().emplace_back(family, init);
  return true;
}

void bind_registered_ops(py::module_& ops) {
  auto entries = registry();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < entries.size(); ++i)
    XT_CHECK(entries[i].first != entries[i - 1].first, RuntimeError, "xtrain._C.ops: the op family '",
             entries[i].first, "' registered its bindings twice (two XT_BIND_OPS with one name)");
  for (const auto& [family, init] : entries) init(ops);
}

}  // namespace xt
