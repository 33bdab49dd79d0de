// The one binding translation unit of the cpp fixtures (one object keeps the shared build short).
// Each fixture's code lives in a *_fixture.h file; a fixture's snapshot carries only the *_fixture.h files it
// uses, so the harness's source rules read exactly that fixture's code.
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#include "../binding_registry.h"
#include "check.h"

#include "misc_fixture.h"
#include "threads_fixture.h"
#include "torch_ops_fixture.h"
#include "torch_hidden_fixture.h"
#include "torch_alias_direct_fixture.h"
#include "torch_alias_hidden_fixture.h"
#include "deferred_fixture.h"
#include "deferred_jthread_fixture.h"
#include "persistent_worker_fixture.h"

static void register_fixtures(pybind11::module& m) {
  register_misc(m);
  register_threads(m);
  register_torch_ops(m);
  register_torch_hidden(m);
  register_torch_alias_direct(m);
  register_torch_alias_hidden(m);
  register_deferred(m);
  register_deferred_jthread(m);
  register_persistent_worker(m);
}

REGISTER_BINDING(fixtures, register_fixtures);
