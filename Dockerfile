# The coordinator image used by docker-compose.yml (also runs `kernelfleet db upgrade`).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
# pyproject.toml's package-dir maps the top-level package to kernelfleet/ and the rest to the folders below
COPY kernelfleet ./kernelfleet
COPY service ./service
COPY worker ./worker
COPY web ./web
COPY kernels ./kernels
COPY migrations ./migrations
RUN pip install . && useradd --create-home kernelfleet
USER kernelfleet
WORKDIR /home/kernelfleet
EXPOSE 8600
CMD ["kernelfleet", "serve", "--host", "0.0.0.0", "--port", "8600"]
