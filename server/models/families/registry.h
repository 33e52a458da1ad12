// The families, as data, one file each: each function below returns its
// family's description, and the table in registry.cc lists them.  Each op
// cites the diffusers 0.42.1 code it mirrors; the parity tests
// (tests/models/conditioning/test_conditioning_parity.py) run that code and
// compare.  Adding a family is adding its file, its declaration here, its
// line in the table and its file in server/models/CMakeLists.txt.
#ifndef TEMB_MODELS_FAMILIES_REGISTRY_H_
#define TEMB_MODELS_FAMILIES_REGISTRY_H_

#include "temb/models/family.h"

namespace temb::models::families {

FamilyDescription QwenImage();
FamilyDescription Flux1();
FamilyDescription Sd3();
FamilyDescription Wan();
FamilyDescription PixArt();
FamilyDescription CogVideoX();
FamilyDescription HunyuanVideo15();
FamilyDescription Flux2();
FamilyDescription SdxlUnet();
FamilyDescription Ltx();
FamilyDescription HiDream();
FamilyDescription Sana();
FamilyDescription ZImage();
FamilyDescription Lumina2();
FamilyDescription HunyuanVideo();
FamilyDescription Chroma();
FamilyDescription AuraFlow();
FamilyDescription MiniMaxH3();
FamilyDescription CogView4();
FamilyDescription LongCatImage();
FamilyDescription OvisImage();
FamilyDescription Bria();
FamilyDescription BriaFibo();
FamilyDescription MotifVideo();
FamilyDescription HunyuanVideoFramepack();
FamilyDescription HunyuanImage();

}  // namespace temb::models::families

#endif  // TEMB_MODELS_FAMILIES_REGISTRY_H_
