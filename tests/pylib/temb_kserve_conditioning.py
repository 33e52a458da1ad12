"""A conditioning client over KServe v2 gRPC (tritonclient): the
``condition()`` / ``models()`` interface temb.torch.offload_conditioning
uses, for the tests and benchmarks that drive a temb-server's conditioning
models through its KServe front door."""

import os

import torch
import tritonclient.grpc as triton_grpc


class KServeConditioning:
    """``condition()`` and ``models()`` over tritonclient.grpc: outputs as
    CPU torch tensors in the served dtype (tritonclient gives BF16 as
    float32 holding the value).  It reconnects lazily, so it pickles and
    survives fork(); `calls` counts the requests."""

    _DTYPES = {"BF16": "bf16", "FP32": "fp32", "FP16": "fp16"}

    def __init__(self, target, names):
        self.target = target
        self.names = list(names)
        self.calls = 0
        self._client = None
        self._pid = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    @property
    def client(self):
        if self._client is None or self._pid != os.getpid():
            self._client = triton_grpc.InferenceServerClient(self.target)
            self._pid = os.getpid()
        return self._client

    def condition(self, model, timesteps, guidance=None,
                  pooled_projections=None, outputs=None, return_tensors=None,
                  **extras):
        """`extras`: a family's other inputs by name (SDXL's time_ids,
        PixArt-alpha's resolution and aspect_ratio, CogVideoX 1.5's ofs,
        Qwen-Image-Layered's addition_t_cond)."""
        self.calls += 1
        inputs = []
        for name, value in (("timesteps", timesteps), ("guidance", guidance),
                            ("pooled_projections", pooled_projections),
                            *extras.items()):
            if value is None:
                continue
            array = torch.as_tensor(value).float().numpy()
            inputs.append(triton_grpc.InferInput(name, list(array.shape),
                                                 "FP32"))
            inputs[-1].set_data_from_numpy(array)
        requested = [triton_grpc.InferRequestedOutput(n)
                     for n in outputs or ()]
        result = self.client.infer(model, inputs, outputs=requested or None)
        answer = {}
        for output in result.get_response(as_json=True)["outputs"]:
            value = torch.from_numpy(result.as_numpy(output["name"]).copy())
            if output["datatype"] == "BF16":
                value = value.to(torch.bfloat16)  # exact: it holds a bf16
            answer[output["name"]] = value
        return answer

    def models(self):
        found = []
        for name in self.names:
            metadata = self.client.get_model_metadata(name, as_json=True)
            # The weights' fingerprints and what each output replaces ride
            # in the model config's parameters: "weight_fingerprint:<tensor>",
            # "replaces:<output>" and the keys beside it, and
            # "folded_module:<module>".
            config = self.client.get_model_config(name, as_json=True)
            parameters = {
                key: value["string_value"] for key, value in
                config["config"].get("parameters", {}).items()}

            def named(prefix, parameters=parameters):
                return {key[len(prefix):]: value
                        for key, value in parameters.items()
                        if key.startswith(prefix)}
            replaces, kinds = named("replaces:"), named("replaced_kind:")
            blocks, inputs_of = named("blocks:"), named("input_module:")
            embedding = named("embedding:")
            outputs = tuple(
                _Output(o["name"], self._DTYPES.get(o["datatype"]),
                        tuple(int(d) for d in o["shape"][1:]),
                        replaces.get(o["name"], ""),
                        kinds.get(o["name"], ""),
                        tuple(int(b) for b in
                              blocks[o["name"]].split(","))
                        if o["name"] in blocks else (),
                        inputs_of.get(o["name"], ""),
                        embedding.get(o["name"], ""))
                for o in metadata["outputs"])
            # The listed inputs ([-1, 1] for one value per row), then those
            # given instead of one ("stands_for:<input>"), with where a
            # patch captures each ("module:", "argument:", "instead_of:").
            stands_for = named("stands_for:")
            modules, arguments = named("module:"), named("argument:")
            instead_of = named("instead_of:")
            rounded = named("in_model_dtype:")
            widths = {i["name"]: int(i["shape"][-1])
                      for i in metadata["inputs"]}
            inputs = tuple(
                _Input(n, 0 if widths.get(n, 1) == 1 else widths[n],
                       stands_for.get(n, ""), instead_of.get(n, ""),
                       modules.get(n, ""), arguments.get(n, ""),
                       n in rounded)
                for n in list(widths) + sorted(stands_for))
            folded = tuple(_Folded(module, kind) for module, kind in
                           sorted(named("folded_module:").items()))
            results = parameters.get("embedder_results")
            found.append(_Model(
                name, "ready", outputs[0].dtype, inputs, outputs,
                named("weight_fingerprint:"), folded,
                parameters.get("class_name", ""), named("config:"),
                tuple(results.split(",")) if results is not None else ()))
        return found


class _Output:
    def __init__(self, name, dtype, row_shape, replaces, replaced_kind,
                 blocks, input_module, embedding):
        self.name, self.dtype, self.row_shape = name, dtype, row_shape
        self.replaces, self.replaced_kind = replaces, replaced_kind
        self.blocks, self.input_module = blocks, input_module
        self.embedding = embedding


class _Folded:
    def __init__(self, module, kind):
        self.module, self.kind = module, kind


class _Input:
    def __init__(self, name, width, stands_for, instead_of, module,
                 argument, in_model_dtype):
        self.name, self.width = name, width
        self.stands_for, self.instead_of = stands_for, instead_of
        self.module, self.argument = module, argument
        self.in_model_dtype = in_model_dtype


class _Model:
    def __init__(self, name, state, dtype, inputs, outputs,
                 weight_fingerprints, folded_modules, class_name, config,
                 embedder_results):
        self.name, self.state, self.dtype = name, state, dtype
        self.inputs, self.outputs = inputs, outputs
        self.weight_fingerprints = weight_fingerprints
        self.folded_modules = folded_modules
        self.class_name, self.config = class_name, config
        self.embedder_results = embedder_results
        self.family, self.message = "", ""
