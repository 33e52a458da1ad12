// The table of families, in the order Families() lists them, and
// FindFamily() (family.h).
#include "registry.h"

#include <string>
#include <vector>

namespace temb::models {

const std::vector<FamilyDescription>& Families() {
  static const auto* table = new std::vector<FamilyDescription>{
      families::QwenImage(),              // qwen_image.cc
      families::Flux1(),                  // flux1.cc
      families::Sd3(),                    // sd3.cc
      families::Wan(),                    // wan.cc
      families::PixArt(),                 // pixart.cc
      families::CogVideoX(),              // cogvideox.cc
      families::HunyuanVideo15(),         // hunyuan_video15.cc
      families::Flux2(),                  // flux2.cc
      families::SdxlUnet(),               // sdxl_unet.cc
      families::Ltx(),                    // ltx.cc
      families::HiDream(),                // hidream.cc
      families::Sana(),                   // sana.cc
      families::ZImage(),                 // z_image.cc
      families::Lumina2(),                // lumina2.cc
      families::HunyuanVideo(),           // hunyuan_video.cc
      families::Chroma(),                 // chroma.cc
      families::AuraFlow(),               // auraflow.cc
      families::MiniMaxH3(),              // minimax_h3.cc
      families::CogView4(),               // cogview4.cc
      families::LongCatImage(),           // flux1_like.cc
      families::OvisImage(),              // flux1_like.cc
      families::Bria(),                   // bria.cc
      families::HunyuanImage(),           // hunyuan_image.cc
      families::HunyuanVideoFramepack(),  // hunyuan_video.cc
      families::MotifVideo(),             // flux1_like.cc
      families::BriaFibo(),               // bria.cc
  };
  return *table;
}

const FamilyDescription* FindFamily(const std::string& class_name) {
  for (const FamilyDescription& family : Families()) {
    if (family.class_name == class_name) return &family;
  }
  return nullptr;
}

}  // namespace temb::models
