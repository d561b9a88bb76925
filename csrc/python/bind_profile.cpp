// xtrain._C.profile: the CPU profile's switch and table (core/cpu_profile.h).
#include "core/cpu_profile.h"
#include "python/bind.h"

namespace xt {

void init_profile(py::module_& m) {
  py::module_ p = m.def_submodule("profile", "The CPU profile: wall time and calls per CPU kernel and backward Node");
  p.def("cpu_enable", &cpu_profile::set_enabled, py::arg("enabled") = true,
        "Start (True) or stop (False) recording; the entries recorded so far are kept");
  p.def("cpu_enabled", &cpu_profile::on, "Whether the CPU profile is recording");
  p.def("cpu_reset", &cpu_profile::reset, "Drop every entry recorded so far");
  p.def("cpu_read", [] {
          py::list out;
          for (const cpu_profile::Entry& e : cpu_profile::read()) {
            py::dict d;
            d["name"] = e.name;
            d["kind"] = e.kind;
            d["phase"] = e.phase;
            d["calls"] = e.calls;
            d["seconds"] = e.seconds;
            out.append(d);
          }
          return out;
        },
        "The entries recorded since the last reset, each a dict: name, kind ('kernel': a CPU kernel's own time; "
        "'node': a backward Node's apply, kernels included), phase ('forward' or 'backward'), calls, seconds");
}

}  // namespace xt
