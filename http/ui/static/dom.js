// The only way this page creates content: elements and text nodes. No HTML strings anywhere (the
// page's Content-Security-Policy requires Trusted Types, so an innerHTML assignment would throw).

export function el(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

export function $(id) {
  const node = document.getElementById(id);
  if (!node) throw new Error(`#${id} is missing`);
  return node;
}
