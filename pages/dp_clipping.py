"""Placeholder: this page is being built."""

import streamlit as st

st.title("dp_clipping")
st.info("This page is being built.")
