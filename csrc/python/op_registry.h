// The registry of xtrain._C.ops's bindings: each op family binds its ops in a file of its own
// (csrc/python/ops/<family>.cpp) and registers that file's init function here with
// XT_BIND_OPS(family, ops) { ops.def(...); ... }, so adding a family touches no central list.
// module.cpp runs the registered functions in the order of their family names, so the module's
// contents never depend on link order. A family name registered twice fails the import.
#pragma once
#include "python/bind.h"

namespace xt {

using OpsInit = void (*)(py::module_& ops);

// Called during static initialisation by XT_BIND_OPS; returns true so its result can initialise
// a static.
bool register_ops_binding(const char* family, OpsInit init);
// Runs every registered init function on `ops`, sorted by family name.
void bind_registered_ops(py::module_& ops);

}  // namespace xt

#define XT_BIND_OPS(family, ops)                                                                  \
  static void xt_bind_ops_##family(::xt::py::module_& ops);                                      \
  [[maybe_unused]] static const bool xt_bind_ops_registered_##family =                           \
      ::xt::register_ops_binding(#family, &xt_bind_ops_##family);                                \
  static void xt_bind_ops_##family(::xt::py::module_& ops)
