# GPU image: vLLM's own OpenAI server image of the pinned version, plus the AdaptiveSpec plugin.
#   docker build -t vllm-adaptivespec:gpu .
#   docker run --gpus all -p 8000:8000 -v models:/models \
#     -e MODEL=meta-llama/Llama-3.1-8B-Instruct -e SPEC_METHOD=eagle3 \
#     -e DRAFT_MODEL=yuhuili/EAGLE3-LLaMA3.1-Instruct-8B -e ADAPTIVESPEC_TAU=0.7 vllm-adaptivespec:gpu
# Settings: the environment variables read by deploy/entrypoint.sh; arguments go to `vllm serve` as they are.
FROM vllm/vllm-openai:v0.32.0

# AdaptiveSpec hooks vLLM's V1 model runner (the plugin also sets this itself when it is active).
ENV VLLM_USE_V2_MODEL_RUNNER=0 \
    VLLM_NO_USAGE_STATS=1 \
    ADAPTIVESPEC_CACHE=/models \
    HF_HOME=/models/huggingface \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /opt/adaptivespec
COPY setup.py README.md ./
COPY vllm_adaptivespec ./vllm_adaptivespec
COPY deploy/install.sh deploy/entrypoint.sh ./deploy/
# Plain `pip install .` under a constraint on the image's torch/vLLM; fails if either would change.
RUN ./deploy/install.sh gpu

VOLUME ["/models"]
EXPOSE 8000
ENTRYPOINT ["/opt/adaptivespec/deploy/entrypoint.sh"]
