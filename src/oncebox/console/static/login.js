// The login page's script, when no users are configured: the link the console printed carries
// its one-time token after "#" (…/login#token=…), which a browser never sends to a server, so no
// request line, access log or proxy log holds it. This takes it out of the address (and so out
// of the history), puts it in the form and posts it. Without script, paste the token instead.
(() => {
  const found = /^#token=([A-Za-z0-9_-]{16,128})$/.exec(window.location.hash);
  if (!found) return;
  window.history.replaceState(null, "", window.location.pathname + window.location.search);
  const form = document.getElementById("token-login");
  if (!form) return;
  form.elements.token.value = found[1];
  form.submit();
})();
