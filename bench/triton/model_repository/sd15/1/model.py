"""diffusers get_timestep_embedding(t, 320, flip_sin_to_cos=True,
downscale_freq_shift=0) in float32 numpy, as a Triton Python backend model
(the same function as pytriton_server.py)."""
import numpy as np
import triton_python_backend_utils as pb_utils

DIM = 320
MAX_PERIOD = 10000.0


class TritonPythonModel:
    """One request at a time, one embedding per request."""

    def initialize(self, args):  # pylint: disable=unused-argument
        half = DIM // 2
        exponent = (-np.log(np.float32(MAX_PERIOD)) *
                    np.arange(half, dtype=np.float32)) / np.float32(half)
        self.freqs = np.exp(exponent).astype(np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "TIMESTEP")
            angles = (t.as_numpy().astype(np.float32).reshape(-1, 1) *
                      self.freqs[None, :])
            emb = np.concatenate([np.cos(angles), np.sin(angles)],
                                 axis=1).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("EMBEDDING", emb)]))
        return responses
