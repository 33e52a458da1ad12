// FLUX.1's description with its time ops left to the caller: FLUX.1's own
// (flux1.cc) and HunyuanVideo (1.0)'s (hunyuan_video.cc).
#ifndef TEMB_MODELS_FAMILIES_FLUX1_H_
#define TEMB_MODELS_FAMILIES_FLUX1_H_

#include <string>
#include <vector>

#include "temb/models/family.h"

namespace temb::models::families {

// FLUX.1's conditioning after `time_ops`, which give t_model from the
// scheduler's t as the family's pipeline and model compute it; HunyuanVideo
// (1.0) computes the same from its own t.
// `forward_value`: the value of time_ops the transformer's forward receives
// as its timestep.
FamilyDescription Flux1Like(std::string class_name, std::string name,
                            std::vector<Op> time_ops,
                            const std::string& forward_value);

}  // namespace temb::models::families

#endif  // TEMB_MODELS_FAMILIES_FLUX1_H_
