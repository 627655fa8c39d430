# VLM Playground on the official vLLM image (CUDA; vLLM 0.32.0, the version the tests run on CPU).
# The same install step as a GPU machine's `make run` (pip install -r requirements.txt), then the
# app on port 7860 as a non-root user with its public-page defaults. Model weights and the demo
# models go to the /data volume, where a Hugging Face Space mounts its persistent storage.
FROM vllm/vllm-openai:v0.32.0

ENV APP_HOST=0.0.0.0 \
    APP_PORT=7860 \
    HF_HOME=/data/huggingface \
    APP_HF_CACHE=/data/huggingface/hub \
    XDG_CACHE_HOME=/data/cache \
    APP_DATA_DIR=/data/history \
    GRADIO_ANALYTICS_ENABLED=False \
    PYTHONUNBUFFERED=1

WORKDIR /home/user/app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt \
    && useradd --create-home --uid 1000 user \
    && mkdir -p /data \
    && chown user:user /data

COPY --chown=user:user app/ app/
COPY --chown=user:user model_cards/ model_cards/
COPY --chown=user:user static/ static/

USER 1000
VOLUME ["/data"]
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/config', timeout=4)"]
ENTRYPOINT ["python3", "-m", "app"]
