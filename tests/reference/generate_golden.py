#!/usr/bin/env python3
"""Writes the float64 golden tables the kernel tests compare against.

Every family of docs/semantics.md (LDM, diffusers' general form, DDPM,
Transformer PE, repeat_only, Flux's time_factor, the slope-first exponent) is evaluated here on its own,
straight from its published formula, in float64 with Python's `math` only: no
float32 op order, no shared code with the C++ backends.  Timesteps are first
rounded to float32, because that is what the service receives.

The script checks itself before writing: the golden rows quoted in the
docs/semantics.md (section 8) must come out to 9 significant digits, and the
equivalences between families must hold.

Regenerate (from the repository root) and commit the result:
    python3 tests/reference/generate_golden.py
or check that the committed tables are current:
    python3 tests/reference/generate_golden.py --check
"""

import argparse
import json
import math
import os
import struct
import sys

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden",
                      "embeddings.json")


def f32(x):
    """Rounds a Python float to the nearest float32 (ties to even)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# --- The families, each from its own formula --------------------------------

def ldm(t, dim, max_period=10000.0):
    """LDM / ADM / DiT / SD: [cos(t f), sin(t f)], f_i = exp(-ln(P) i / H)."""
    half = dim // 2
    freqs = [math.exp(-math.log(max_period) * i / half) for i in range(half)]
    row = [math.cos(t * f) for f in freqs] + [math.sin(t * f) for f in freqs]
    if dim % 2:
        row.append(0.0)
    return row


def diffusers(t, dim, flip_sin_to_cos=False, downscale_freq_shift=1.0,
              scale=1.0, max_period=10000.0):
    """diffusers' get_timestep_embedding, general form."""
    half = dim // 2
    exponents = [-math.log(max_period) * i / (half - downscale_freq_shift)
                 for i in range(half)]
    angles = [scale * (t * math.exp(e)) for e in exponents]
    sin = [math.sin(a) for a in angles]
    cos = [math.cos(a) for a in angles]
    row = cos + sin if flip_sin_to_cos else sin + cos
    if dim % 2:
        row.append(0.0)
    return row


def ddpm(t, dim):
    """DDPM / tensor2tensor: [sin, cos], f_i = exp(-ln(10000) i / (H - 1))."""
    half = dim // 2
    step = math.log(10000.0) / (half - 1)
    freqs = [math.exp(-step * i) for i in range(half)]
    row = [math.sin(t * f) for f in freqs] + [math.cos(t * f) for f in freqs]
    if dim % 2:
        row.append(0.0)
    return row


def slope_first(t, dim, time_factor=1000.0, max_period=10000.0):
    """LongCat-AudioDiT / Ideogram 4: [sin, cos] of time_factor * t * f with
    f_i = exp(i * -(ln(P) / (H - 1))), the slope computed first."""
    half = dim // 2
    slope = math.log(max_period) / (half - 1)
    freqs = [math.exp(i * -slope) for i in range(half)]
    angles = [time_factor * t * f for f in freqs]
    row = [math.sin(a) for a in angles] + [math.cos(a) for a in angles]
    if dim % 2:
        row.append(0.0)
    return row


def transformer(pos, dim, base=10000.0):
    """Vaswani PE: sin(pos / base^(2i/d)) at 2i, cos at 2i + 1."""
    row = []
    for i in range(dim // 2):
        angle = pos / base ** (2.0 * i / dim)
        row += [math.sin(angle), math.cos(angle)]
    return row


def flux(t, dim, time_factor=1000.0, max_period=10000.0):
    """Flux: the LDM embedding of time_factor * t."""
    return ldm(time_factor * t, dim, max_period)


def repeat_only(t, dim):
    return [t] * dim


# --- The cases ---------------------------------------------------------------

def spec(dim, max_period=10000.0, flip_sin_to_cos=True, shift=0.0, scale=1.0,
         time_factor=1.0, repeat=False, layout="halves",
         exponent_order="divide_last"):
    out = {
        "dim": dim, "max_period": max_period, "flip_sin_to_cos": flip_sin_to_cos,
        "downscale_freq_shift": shift, "scale": scale, "time_factor": time_factor,
        "repeat_only": repeat, "layout": layout,
    }
    if exponent_order != "divide_last":  # the key appears only when it matters
        out["exponent_order"] = exponent_order
    return out


def cases():
    """(name, family, spec, timesteps, row function of a float32 timestep)."""
    out = []

    def add(name, family, s, timesteps, fn):
        out.append((name, family, s, [f32(t) for t in timesteps], fn))

    diffusion_t = [0.0, 1.0, 999.0, 500.5, 0.25, 37.0]
    add("ldm_d8_t1", "ldm", spec(8), [1.0], lambda t: ldm(t, 8))
    add("ldm_d8_t999", "ldm", spec(8), [999.0], lambda t: ldm(t, 8))
    for dim in (320, 256):
        add(f"ldm_d{dim}", "ldm", spec(dim), diffusion_t, lambda t, d=dim: ldm(t, d))
    add("ldm_d1280", "ldm", spec(1280), [1.0, 999.0, 500.5], lambda t: ldm(t, 1280))
    for dim in (1, 2, 3, 7, 33, 255):
        add(f"ldm_d{dim}", "ldm", spec(dim), [0.0, 1.0, 999.0, -17.5],
            lambda t, d=dim: ldm(t, d))
    add("ldm_period100_d64", "ldm", spec(64, max_period=100.0), diffusion_t,
        lambda t: ldm(t, 64, 100.0))
    add("ldm_period0.5_d16", "ldm", spec(16, max_period=0.5), [0.0, 0.5, -3.0, 20.0],
        lambda t: ldm(t, 16, 0.5))
    add("ldm_wide_t_d32", "ldm", spec(32),
        [-1.0, -999.5, 0.001, 0.1, 12345.678, 65504.0, -100000.0, 1e-30],
        lambda t: ldm(t, 32))

    add("ddpm_d7_t10.5", "diffusers", spec(7, flip_sin_to_cos=False, shift=1.0),
        [10.5], lambda t: diffusers(t, 7))
    for dim in (128, 9, 4):
        add(f"ddpm_d{dim}", "ddpm", spec(dim, flip_sin_to_cos=False, shift=1.0),
            [0.0, 1.0, 999.0, 123.75, -4.5], lambda t, d=dim: ddpm(t, d))
    general = [
        (64, False, 0.0, 1.0, 10000.0),
        (64, True, 1.0, 1.0, 10000.0),
        (64, False, 0.5, 1000.0, 10000.0),
        (65, True, -1.0, 0.5, 10000.0),
        (48, True, 0.0, -2.0, 1000000.0),
        (10, False, 2.0, 3.0, 50.0),
        (256, True, 1.0, 1.0, 10000.0),  # dit-diffusers
    ]
    for dim, flip, shift, scale, period in general:
        add(f"diffusers_d{dim}_flip{int(flip)}_shift{shift:g}_scale{scale:g}_p{period:g}",
            "diffusers", spec(dim, period, flip, shift, scale),
            [0.0, 1.0, 999.0, 0.3, -250.25],
            lambda t, d=dim, fl=flip, sh=shift, sc=scale, p=period:
            diffusers(t, d, fl, sh, sc, p))

    add("transformer_d4_base100_pos2", "transformer",
        spec(4, max_period=100.0, flip_sin_to_cos=False, layout="interleaved"), [2.0],
        lambda t: transformer(t, 4, 100.0))
    for dim, positions in ((2, [0.0, 1.0, 2.0, 77.0, 4095.0]),
                           (16, [0.0, 1.0, 2.0, 77.0, 4095.0]),
                           (512, [1.0, 77.0, 4095.0])):
        add(f"transformer_d{dim}", "transformer",
            spec(dim, flip_sin_to_cos=False, layout="interleaved"),
            positions, lambda t, d=dim: transformer(t, d))
    add("interleaved_flip_d10", "diffusers",
        spec(10, flip_sin_to_cos=True, shift=1.0, scale=2.0, layout="interleaved"),
        [0.0, 1.5, 999.0], lambda t: interleave(diffusers(t, 10, True, 1.0, 2.0)))

    add("flux_d256", "flux", spec(256, time_factor=1000.0),
        [0.0, 0.25, 0.5, 1.0, 0.123, 0.999], lambda t: flux(t, 256))
    add("time_factor_scale_d24", "diffusers",
        spec(24, flip_sin_to_cos=False, shift=0.0, scale=0.5, time_factor=3.0),
        [0.0, 1.0, 333.0], lambda t: diffusers(3.0 * t, 24, False, 0.0, 0.5))

    for dim, period in ((256, 10000.0), (33, 100.0)):
        add(f"slope_first_d{dim}_p{period:g}", "slope_first",
            spec(dim, max_period=period, flip_sin_to_cos=False, shift=1.0,
                 time_factor=1000.0, exponent_order="slope_first"),
            [0.0, 0.001, 0.25, 0.5, 0.999, 1.0],
            lambda t, d=dim, p=period: slope_first(t, d, 1000.0, p))

    for dim in (1, 5, 64):
        add(f"repeat_only_d{dim}", "repeat_only", spec(dim, repeat=True),
            [0.0, -7.5, 123.25, 0.1, 65504.0], lambda t, d=dim: repeat_only(t, d))
    return out


def interleave(row):
    half = len(row) // 2
    out = []
    for i in range(half):
        out += [row[i], row[half + i]]
    return out


# --- Self-checks -------------------------------------------------------------

GUIDE_ROWS = [
    (lambda: ldm(1.0, 8), "0.540302306, 0.995004165, 0.99995, 0.9999995, "
     "0.841470985, 0.0998334166, 0.00999983333, 0.000999999833"),
    (lambda: ldm(999.0, 8), "0.999649853, 0.807458658, -0.844469696, 0.541143507, "
     "-0.0264607527, -0.589924161, -0.535603335, 0.840930262"),
    (lambda: diffusers(10.5, 7, flip_sin_to_cos=False, downscale_freq_shift=1.0),
     "-0.87969576, 0.104807169, 0.00104999981, -0.475536928, 0.994492563, "
     "0.999999449, 0"),
    (lambda: transformer(2.0, 4, 100.0), "0.909297427, -0.416146837, 0.198669331, "
     "0.980066578"),
]


def self_check():
    for fn, expected in GUIDE_ROWS:
        got = ", ".join("%.9g" % x for x in fn())
        assert got == expected, f"guide row mismatch:\n  got      {got}\n  expected {expected}"

    # The formulas round differently in float64 (pow vs exp, i/H vs 2i/D):
    # they agree to ~1e-15 of the angle.
    def close(a, b, t):
        return len(a) == len(b) and all(
            abs(x - y) <= 1e-13 * (1 + abs(t)) for x, y in zip(a, b))

    for t in (0.0, 1.0, 999.0, -3.5, 12345.0):
        for dim in (1, 2, 8, 9, 320):
            assert close(ldm(t, dim), diffusers(t, dim, True, 0.0), t), ("ldm", t, dim)
        for dim in (4, 7, 128):
            assert close(ddpm(t, dim), diffusers(t, dim, False, 1.0), t), ("ddpm", t, dim)
        for dim in (4, 33, 256):
            assert close(slope_first(t, dim, 1.0),
                         diffusers(t, dim, False, 1.0), t), ("slope", t, dim)
        for dim in (2, 16, 512):
            assert close(transformer(t, dim),
                         interleave(diffusers(t, dim, False, 0.0)), t), ("pe", t, dim)
    assert ldm(0.0, 9) == [1.0] * 4 + [0.0] * 5


# --- Output ------------------------------------------------------------------

def build():
    tables = []
    for name, family, s, timesteps, fn in cases():
        rows = [fn(t) for t in timesteps]
        assert all(len(r) == s["dim"] for r in rows), name
        assert all(math.isfinite(x) for r in rows for x in r), name
        tables.append({"name": name, "family": family, "spec": s,
                       "timesteps": timesteps, "expected": rows})
    return {
        "generator": "tests/reference/generate_golden.py",
        "note": "float64 evaluations of each family's own formula; timesteps are "
                "float32 values; halves rows with odd dim end in one 0",
        "cases": tables,
    }


def render(doc):
    # One row per line keeps diffs readable; repr() round-trips doubles.
    lines = ["{", f'  "generator": {json.dumps(doc["generator"])},',
             f'  "note": {json.dumps(doc["note"])},', '  "cases": [']
    for k, case in enumerate(doc["cases"]):
        lines.append("    {")
        lines.append(f'      "name": {json.dumps(case["name"])},')
        lines.append(f'      "family": {json.dumps(case["family"])},')
        lines.append(f'      "spec": {json.dumps(case["spec"])},')
        lines.append(f'      "timesteps": {json.dumps(case["timesteps"])},')
        lines.append('      "expected": [')
        rows = case["expected"]
        for j, row in enumerate(rows):
            lines.append("        " + json.dumps(row) + ("," if j + 1 < len(rows) else ""))
        lines.append("      ]")
        lines.append("    }" + ("," if k + 1 < len(doc["cases"]) else ""))
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if the committed tables differ from a fresh run")
    parser.add_argument("--output", default=OUTPUT)
    args = parser.parse_args()
    self_check()
    text = render(build())
    if args.check:
        with open(args.output, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{args.output} is stale: rerun {sys.argv[0]}", file=sys.stderr)
                return 1
        print("golden tables are current")
        return 0
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {len(build()['cases'])} cases to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
