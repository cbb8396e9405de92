"""Placeholder: this page is being built."""

import streamlit as st

st.title("equivalence")
st.info("This page is being built.")
