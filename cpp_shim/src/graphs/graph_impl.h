// torch.accelerator.Graph for the device: an at::GraphImplInterface over
// Graph (graph.h), registered in PyTorch's GraphImplRegistry (ATen/core/
// GraphImplInterface.h; every supported torch has it, and the code compiles
// to nothing on one without it).
#pragma once

namespace torchfl::graphs {

// Registers the implementation under the device's name, which PyTorch keys
// by the upper-cased PrivateUse1 backend name ("SIM"): call it once the
// backend is renamed. Later calls do nothing. Returns whether this torch has
// the registry.
bool register_graph_impl();

}  // namespace torchfl::graphs
