// Test-only (docs/runtime.md): LFC_TEST_FAULT=<fault>:rank=<r> makes global rank r meet <fault>,
// so that tests can force what real data or a real machine reaches only by accident. In every
// two-phase collective it runs, after the size exchange (collectives.cc):
//   all_to_all_v_bound   all_to_all_v's receive bound is exceeded
//   gather_v_rows        a gather_v root finds a row count wrong (on a root only)
//   kill_between_phases  the process kills itself (SIGKILL) between the phases of all_to_all_v,
//                        gather_v or scatter_v
// When a shared-memory group opens (shm.cc):
//   direct_map_refused   the kernel refuses this rank the mapping of its peers' memory
#pragma once

namespace lfc::comm {

bool testFault(const char* fault, int rank);

}  // namespace lfc::comm
