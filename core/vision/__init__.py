"""Image input: decoding an image into an `ImageInput` (image.py), and the contract between the HTTP
layer and a vision-language model's front end (front.py). Torch-free: the HTTP layer imports it."""
