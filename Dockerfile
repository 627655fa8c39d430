# VLM Playground on the official vLLM image (CUDA; vLLM 0.32.0, the version the tests run on CPU).
# The same install step as a GPU machine's `make run` (pip install -r requirements.txt), then the
# app on port 7860 as user 1000 (the user a Hugging Face Space runs) with its public-page
# defaults. Model weights and the demo models go to the /data volume, where a Space mounts its
# persistent storage. What this file assumes of the base image is in docker/base-image.json,
# checked by tests/test_shipping.py.
FROM vllm/vllm-openai:v0.32.0

ENV APP_HOST=0.0.0.0 \
    APP_PORT=7860 \
    HF_HOME=/data/huggingface \
    APP_HF_CACHE=/data/huggingface/hub \
    XDG_CACHE_HOME=/data/cache \
    APP_DATA_DIR=/data/history \
    GRADIO_ANALYTICS_ENABLED=False \
    PYTHONUNBUFFERED=1

# The base image (Ubuntu 24.04 since vLLM 0.28) already has uid 1000 (`ubuntu`): it makes way
# for `user`, the name and uid a Space expects. Its Python may be the system's, which Ubuntu
# marks externally managed; in the image nothing else shares it.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN if getent passwd 1000 >/dev/null; then userdel --force "$(getent passwd 1000 | cut -d: -f1)"; fi \
    && useradd --create-home --uid 1000 --shell /bin/bash user \
    && mkdir -p /data /home/user/app \
    && chown user:user /data /home/user/app

WORKDIR /home/user/app
COPY requirements.txt .
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir -r requirements.txt

COPY --chown=user:user app/ app/
COPY --chown=user:user model_cards/ model_cards/
COPY --chown=user:user static/ static/
# The GPU check (bench/gpu_check/), to run in the container: docker run ... --entrypoint
# python3 vlm-playground bench/gpu_check
COPY --chown=user:user bench/ bench/

USER 1000
VOLUME ["/data"]
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/config', timeout=4)"]
ENTRYPOINT ["python3", "-m", "app"]
