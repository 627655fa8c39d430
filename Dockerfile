# NOT A WORKING IMAGE YET. The browser UI arrives with the Gradio app, and the real image
# (port 7860, health check, model cache volume, non-root user, public defaults) with the
# shipping work. In this image `python -m app` only validates and lists the model catalog.
FROM vllm/vllm-openai:v0.32.0

WORKDIR /opt/vlm-playground
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY app/ app/
COPY model_cards/ model_cards/

ENTRYPOINT ["python3", "-m", "app"]
