/*
 * The base of every test plugin (fixture_plugin.c, the torchfl-testkit
 * crate's generated plugins, the benchmarks'): the C example, which is
 * `torchfl-abi new`'s rendering, so the suites run the code vendors start
 * from. Its bootstrap is left out: each includer exports its own, returning
 * a modified copy of g_api.
 */
#define PLUGIN_NO_BOOTSTRAP 1
#include "../../examples/c_plugin/csrc/minimal_c_plugin.c"
