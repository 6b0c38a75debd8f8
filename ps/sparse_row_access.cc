#include "ps/sparse_row_access.h"

namespace chorus::ps {

const char* sparseTechniqueName(SparseTechnique technique) {
  switch (technique) {
    case SparseTechnique::kClassic:
      return "classic";
    case SparseTechnique::kLapse:
      return "lapse";
    case SparseTechnique::kNups:
      return "nups";
    case SparseTechnique::kAuto:
      return "auto";
  }
  return "?";
}

std::optional<SparseTechnique> parseSparseTechnique(const std::string& name) {
  if (name == "classic") return SparseTechnique::kClassic;
  if (name == "lapse") return SparseTechnique::kLapse;
  if (name == "nups") return SparseTechnique::kNups;
  if (name == "auto") return SparseTechnique::kAuto;
  return std::nullopt;
}

std::unique_ptr<SparseRowAccess> makeSparseRowAccess(SparseTechnique technique, node::Node& node,
                                                     KeyStore store, const RowAccessSetup& setup) {
  switch (technique) {
    case SparseTechnique::kLapse:
      return makeLapseRowAccess(node, std::move(store), setup);
    case SparseTechnique::kNups:
      return makeNupsRowAccess(node, std::move(store), setup);
    case SparseTechnique::kAuto:
      return makeAutoRowAccess(node, std::move(store), setup);
    case SparseTechnique::kClassic:
      break;
  }
  return makeClassicRowAccess(node, std::move(store), setup);
}

}  // namespace chorus::ps
