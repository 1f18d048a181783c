// The oncebox console's only script (the CSP allows no inline one): asks before a form marked
// data-confirm is sent. Pages work without it.
document.addEventListener("submit", (event) => {
  const question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) event.preventDefault();
});
