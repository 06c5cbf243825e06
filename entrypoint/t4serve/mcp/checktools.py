"""The tools that check and prepare before a server runs: the host, its GPUs against the image, the Turing clamp
baked into the image (verified, or applied by a build), and the plan.

Each calls what its command calls: t4serve.host.hostcheck for `host-check`, the pipeline and the plan for `plan`,
preflight's clamp check and `t4serve patch verify` in a throwaway container of the image, the image's manifest as its
own `t4serve probe --manifest-only --json` answers it (t4serve.contract).
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from t4serve.config.settings import Settings
from t4serve.errors import EngineError
from t4serve.facts import Facts
from t4serve.host.engine import MANIFEST_PATH
from t4serve.mcp.calls import (
    MODEL_HELP,
    SETTINGS_HELP,
    ModelArgument,
    Progress,
    SettingsArgument,
    ToolGroup,
    blocking,
    guarded,
    in_thread,
    tail_text,
    validate_settings,
)
from t4serve.mcp.models import (
    ClampOut,
    GpuArch,
    GpuOut,
    HostCapacity,
    ManifestOut,
    PlanOut,
    ProfilesOut,
    TuringPatch,
    checks_fields,
    finding_out,
)
from t4serve.mcp.registry import READ_ONLY, hints, tool
from t4serve.preflight import Finding, check_clamp, has_failures
from t4serve.serde import to_dict

VERIFY_TIMEOUT_S = 1200.0


class CheckTools(ToolGroup):
    """The host and image checks, the image build, and the plan."""

    @tool("Check host capacity", "host", READ_ONLY)
    @guarded
    async def check_host_capacity(
        self, model: Annotated[ModelArgument | None, Field(description=MODEL_HELP)] = None, ctx: Context | None = None
    ) -> HostCapacity:
        """Check this host can run the server: driver, container toolkit, disk, memory, /dev/shm.

        NVIDIA driver, NVIDIA Container Toolkit configured for Docker, free space on Docker's data root for the image
        and cache volumes, RAM + swap (and compose's memory limit) against the checkpoint's load need, compose's
        /dev/shm. Same checks as `t4serve host-check`; changes nothing."""
        from t4serve.host.hostcheck import check_host

        settings = validate_settings(model, {}, self.env.base_env())
        findings = await blocking(
            Progress(ctx),
            "checking the host",
            lambda: check_host(settings, self.env.environ, self.engine, self.env.compose_file, nvml=self.env.nvml),
        )
        return HostCapacity(
            compose_file=str(self.env.compose_file), image=self.engine.image_ref, **checks_fields(findings)
        )

    def _facts(self, settings: Settings) -> Facts:
        from t4serve.host.hostcheck import host_facts

        info = self.engine.info()
        return host_facts(
            settings, self.env.environ, self.engine, info=info, image=self.engine.image(), nvml=self.env.nvml
        )

    @tool("Check GPUs against the image", "host", READ_ONLY)
    @guarded
    async def verify_gpu_arch(self, ctx: Context | None = None) -> GpuArch:
        """Check each GPU of this host against the image: compute capability in torch's arch list, driver new enough.

        Reads the GPUs with NVML and the image's build manifest (in a throwaway container); the driver must carry
        the image's CUDA 13 build. Changes nothing."""
        from t4serve.host.hostcheck import arch_findings

        settings = validate_settings(None, {}, self.env.base_env())
        facts = await blocking(Progress(ctx), "reading the GPUs and the manifest", lambda: self._facts(settings))
        gpu, manifest = facts.gpu, facts.manifest
        cuda = f"{gpu.cuda_driver_version[0]}.{gpu.cuda_driver_version[1]}" if gpu.cuda_driver_version else None
        return GpuArch(
            driver_version=gpu.driver_version,
            cuda_driver_version=cuda,
            gpus=[
                GpuOut(
                    index=d.index,
                    name=d.name,
                    compute_capability=f"{d.compute_capability[0]}.{d.compute_capability[1]}",
                    memory_total_bytes=d.memory_total_bytes,
                )
                for d in gpu.devices
            ],
            image=self.engine.image_ref,
            torch_version=manifest.torch_version,
            torch_cuda_version=manifest.torch_cuda_version,
            torch_arch_list=list(manifest.torch_arch_list),
            **checks_fields(arch_findings(facts)),
        )

    @tool("Verify the Turing clamp", "image", READ_ONLY)
    @guarded
    async def verify_turing_patch(
        self,
        skip_interpreter: Annotated[
            bool, Field(description="skip the Triton-interpreter check of the clamp (about a minute less)")
        ] = False,
        ctx: Context | None = None,
    ) -> TuringPatch:
        """Check the Turing attention clamp baked into the image: its manifest proof, and `patch verify` run again.

        `t4serve patch verify` runs in a throwaway container of the image (up to 20 minutes; progress is reported;
        a cancellation removes the container). Changes nothing."""
        from t4serve.planning.plan import plan as make_plan

        progress = Progress(ctx)
        settings = validate_settings(None, {}, self.env.base_env())
        facts = await blocking(progress, "reading the image's manifest", lambda: self._facts(settings))
        manifest = facts.manifest
        if not manifest.present:
            raise EngineError(
                "verify_turing_patch: the image has no build manifest",
                found=manifest.error or "missing",
                required=f"the t4serve image {self.engine.image_ref}",
                fix="call apply_turing_patch (it builds the image), or run scripts/build-image",
            )
        args = ["patch", "verify", *(["--skip-interpreter"] if skip_interpreter else [])]
        done = await blocking(
            progress,
            f"t4serve patch verify in {self.engine.image_ref}",
            lambda: self.engine.run_in_image(args, VERIFY_TIMEOUT_S),
        )
        findings: list[Finding] = []
        gpu = facts.gpu.devices[0] if facts.gpu.devices else None
        if gpu is not None:
            findings.append(check_clamp(manifest, make_plan(settings, facts), gpu))
        code = done.returncode
        findings.append(
            Finding(
                "patch-verify",
                "ok" if code == 0 else "fail",
                f"`t4serve patch verify` exited {code}",
                "exit 0: the installed clamp located, compiled for sm_75 and checked against a reference",
                "" if code == 0 else "rebuild the image with apply_turing_patch; the output says which step failed",
            )
        )
        clamp = manifest.clamp
        output = tail_text((done.stdout + done.stderr).strip(), 8 * 1024)
        return TuringPatch(
            ok=not has_failures(findings) and clamp is not None and clamp.state in ("applied", "not-needed"),
            image=self.engine.image_ref,
            clamp=None
            if clamp is None
            else ClampOut(
                state=clamp.state,
                vllm_version=clamp.vllm_version,
                shared_memory=dict(clamp.shared_memory),
                unpatched_shared_memory=clamp.unpatched_shared_memory,
                interpreter_max_abs_error=clamp.interpreter_max_abs_error,
            ),
            verify_exit_code=code,
            verify_output=output,
            findings=[finding_out(f) for f in findings],
        )

    # Replaces the image tag with a new build (the old image is pruned); building the same tree again is the same.
    @tool("Build the image (applies the clamp)", "image",
          hints(read_only=False, destructive=True, idempotent=True, open_world=True))
    @guarded
    async def apply_turing_patch(self, ctx: Context | None = None) -> ManifestOut:
        """Build the image (scripts/build-image), which applies and proves the Turing clamp; returns its manifest.

        The clamp is applied while the image builds, so this is how it is (re)applied; the image tag is replaced.
        Minutes on a warm cache, up to an hour cold; progress carries the build's latest line, and a cancellation
        stops the build. Holds the deployment's lock."""
        progress = Progress(ctx)
        lines: list[str] = []
        with self.env.exclusive("apply_turing_patch", ctx):
            await progress.say("starting scripts/build-image")
            done = await blocking(
                progress,
                lambda: lines[-1][:200] if lines else "starting scripts/build-image",
                lambda: self.engine.build_image(lines.append),
            )
        output = tail_text("\n".join(lines[-60:]), 8 * 1024)
        if done.returncode != 0:
            raise EngineError(
                "apply_turing_patch: scripts/build-image failed",
                found=f"exit {done.returncode}; last lines:\n{output[-2000:]}",
                required="a successful build (it applies and proves the clamp)",
                fix="read the output above; `scripts/build-image` by hand shows all of it",
            )
        from t4serve.host.hostcheck import image_manifest

        image = await in_thread(self.engine.image)
        manifest = await in_thread(lambda: image_manifest(self.engine, image)) if image is not None else None
        if image is None or manifest is None or not manifest.present:
            raise EngineError(
                "apply_turing_patch: the build finished but the image or its manifest is missing",
                found=f"image {self.engine.image_ref}: "
                + ("absent" if image is None else f"present; {manifest.error if manifest else 'no manifest'}"),
                required=f"{self.engine.image_ref} with {MANIFEST_PATH}",
                fix="run scripts/build-image by hand and read its output",
            )
        return ManifestOut(
            image=image.ref,
            image_id=image.id,
            size_bytes=image.size_bytes,
            build_exit_code=done.returncode,
            build_output=output,
            manifest=to_dict(manifest),
        )

    # Reads a checkpoint's config from the HF hub when it is not in the cache.
    @tool("Plan the vLLM command line", "plan",
          hints(read_only=True, destructive=False, idempotent=True, open_world=True))
    @guarded
    async def plan(
        self,
        model: Annotated[ModelArgument | None, Field(description=MODEL_HELP)] = None,
        gpu_model: Annotated[
            str | None,
            Field(
                description="plan for this known GPU model instead of this host's GPU: t4, l4, a10g, ... (a name, "
                "not a device index)",
                max_length=64,
            ),
        ] = None,
        settings: Annotated[SettingsArgument | None, Field(description=SETTINGS_HELP)] = None,
        ctx: Context | None = None,
    ) -> PlanOut:
        """The `vllm serve` command line t4serve would run, and the numbers behind it (KV cache, concurrency, memory).

        For this host's GPU, or a known GPU model (`gpu_model`), for `model` and optional container settings; the
        same as `t4serve plan`. Changes nothing."""
        from t4serve.pipeline import ensure_model, prepare, with_known_gpu

        chosen = validate_settings(model, settings, self.env.base_env())

        def work() -> tuple[Any, list[Finding]]:
            facts = ensure_model(chosen, self._facts(chosen))
            if gpu_model:
                facts = with_known_gpu(facts, gpu_model.lower())
            return prepare(chosen, facts)

        the_plan, findings = await blocking(Progress(ctx), "planning", work)
        # The container's own checks that mean something for a plan read on the host.
        kept = [f for f in findings if f.check in ("gpu", "capability", "dtype", "sizing", "clamp", "attention",
                                                    "model", "drafter")]
        return PlanOut(
            command_line=the_plan.command_line(),
            summary=the_plan.summary(),
            plan=the_plan.to_dict(),
            settings=chosen.to_dict(),
            findings=[finding_out(f) for f in kept],
        )

    @tool("What runs on this GPU", "plan", hints(read_only=True, destructive=False, idempotent=True, open_world=True))
    @guarded
    async def profiles(
        self,
        model: Annotated[ModelArgument | None, Field(description="another checkpoint to profile beside qat and bf16: "
                                                       + MODEL_HELP)] = None,
        gpu_model: Annotated[
            str | None,
            Field(description="profiles for this known GPU model instead of this host's GPU: t4, l4, a10g, ...",
                  max_length=64),
        ] = None,
        settings: Annotated[SettingsArgument | None, Field(description=SETTINGS_HELP)] = None,
        ctx: Context | None = None,
    ) -> ProfilesOut:
        """What runs on this GPU and host, what does not and why, per checkpoint, KV cache dtype and length.

        qat, bf16 and `model`, each at KV cache dtype auto, int8, int4 and fp8 and at 4k, 16k, 32k and the model's
        maximum length. Every figure is the plan's own (KV tokens, concurrency, weight memory, host memory and swap,
        decode ceiling); the same as `t4serve profiles`. Changes nothing."""
        from t4serve.config.settings import with_model
        from t4serve.pipeline import ensure_model, with_known_gpu
        from t4serve.planning.profiles import profiles, summary
        from t4serve.serde import to_dict

        chosen = validate_settings(model, settings, self.env.base_env())

        def work() -> tuple[str, list[Any]]:
            facts = self._facts(chosen)
            if gpu_model:
                facts = with_known_gpu(facts, gpu_model.lower())
            names = list(dict.fromkeys(("qat", "bf16", chosen.model.requested)))
            cases = []
            for name in names:
                one = chosen if name == chosen.model.requested else with_model(chosen, name, self.env.base_env())
                cases.append((one, ensure_model(one, facts)))
            gpu = facts.gpu.devices[0].name if facts.gpu.devices else "no GPU visible (name a gpu_model)"
            return gpu, profiles(cases)

        gpu, rows = await blocking(Progress(ctx), "planning the profiles", work)
        return ProfilesOut(gpu=gpu, summary=summary(rows, gpu), profiles=[to_dict(r) for r in rows])
